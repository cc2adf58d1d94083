"""kohya_ss's keep-the-last-N keys (sd-scripts' ``save_last_n_epochs``, ``save_last_n_steps`` and
their ``_state`` twins) -> ``[saving]`` (trainer/run/keep_last.py deletes as sd-scripts does).

sd-scripts reads each only when it saves on that schedule: ``save_last_n_epochs`` at the saves
every N epochs, ``save_last_n_steps`` at the saves every N steps, the ``_state`` twins when the
state is saved as well. kohya_ss writes 0 for "off" and keeps a value whose schedule is off;
such a value is reported as not needed, with the reason, instead of failing the import.
"""

from __future__ import annotations

from trainer.importers.kohya import convert as c
from trainer.importers.kohya.report import Ctx
from trainer.importers.kohya.table import Rule

KEYS = ("save_last_n_epochs", "save_last_n_epochs_state", "save_last_n_steps",
        "save_last_n_steps_state")
_COUNT = c.nonzero(c.to_int)
FLAG_RULES = {key: Rule(f"saving.{key}", _COUNT) for key in KEYS}  # additional_parameters


def keep_last(ctx: Ctx) -> None:
    """Each key present: unset when 0, mapped when its schedule (and the state, for a
    ``_state`` key) is on in the imported config, else not needed."""
    saving = ctx.out.get("saving", {})
    for key in KEYS:
        if key not in ctx.data:
            continue
        try:
            off = _COUNT(ctx.raw(key)) is c.UNSET
        except ValueError:  # ctx.apply reports it
            off = False
        every = "save_every_n_epochs" if "epochs" in key else "save_every_n_steps"
        if off:
            ctx.unset(key)
        elif saving.get(every) is None:
            ctx.skip(key, f"sd-scripts reads it only at the saves of {every}, which the file "
                          f"leaves off")
        elif key.endswith("_state") and not saving.get("save_state"):
            ctx.skip(key, "sd-scripts reads it only when the state is saved (save_state), "
                          "which the file leaves off")
        else:
            ctx.apply(key, FLAG_RULES[key])
