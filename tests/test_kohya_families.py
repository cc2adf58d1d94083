"""The kohya importer reads each family's kohya_ss keys from the family's folder
(trainer/families/<folder>/kohya.py): every flow family's role declares what the importer asks
for, no key belongs to two families, and the switches the roles declare pick their family."""

from __future__ import annotations

import pytest

from trainer.families import FAMILIES, names
from trainer.importers.kohya import flow, import_kohya
from trainer.importers.kohya.families import kohya_role, roles, switch_keys, switches

FLOW = names(objective="flow")
FLOW_ROLE = ("SWITCHES", "LORA_TYPES", "RULES", "ENCODER_FILES", "UNSUPPORTED", "NOT_NEEDED",
             "ONLY", "TIMESTEP_RANGE", "finish")


@pytest.mark.parametrize("name", FLOW)
def test_a_flow_family_role_declares_what_the_importer_reads(name):
    role = kohya_role(name)
    assert role is not None, f"{name} has no trainer/families/<folder>/kohya.py"
    assert [a for a in FLOW_ROLE if not hasattr(role, a)] == []
    owned = set(role.ONLY) | set(flow.BOTH)
    assert set(role.RULES) | set(role.UNSUPPORTED) | set(role.NOT_NEEDED) <= owned
    assert all(k in owned for keys in role.ENCODER_FILES.values() for k in keys)


def selected(name: str) -> bool:
    """A family that a value picks among the families of one switch (Chroma: FLUX.1's tab with
    model_type "chroma"): it shares that tab's keys."""
    return bool(getattr(kohya_role(name), "SELECT", None))


def test_no_key_is_two_flow_families_own():
    seen: dict[str, str] = {}
    for name in [n for n in roles("flow") if not selected(n)]:
        for key in kohya_role(name).ONLY:
            assert key not in seen, f"{key} is both {seen[key]}'s and {name}'s"
            seen[key] = name


def test_a_kohya_flux1_config_imports_as_flux1_not_kontext():
    """FLUX.1 Kontext shares FLUX.1's folder (and its kohya role); kohya_ss's FLUX.1 tab is
    FLUX.1's."""
    assert "flux1_kontext" not in roles("flow") and roles("flow")["flux1"] is not None
    assert flow.family_of({"LoRA_type": "Flux1"}) == "flux1"
    assert flow.family_of({"flux1_checkbox": True}) == "flux1"


def test_every_switch_is_one_family_s():
    keys = switch_keys()
    shared = [k for n, ks in switches().items() if selected(n) for k in ks]
    assert len(keys) - len(shared) == len(set(keys))
    assert set(shared) <= {k for n, ks in switches().items() if not selected(n) for k in ks}
    assert set(switches()) <= set(FAMILIES)


@pytest.mark.parametrize("name", [n for n in switches()])
def test_a_family_s_switch_picks_it(name):
    key = switches()[name][0]
    values = {k: v[0] for k, v in getattr(kohya_role(name), "SELECT", {}).items()}
    cfg, report = import_kohya({"LoRA_type": "Standard", key: True, **values},
                               source="switch.json")
    assert cfg.model.model_version == name
    assert (key, True, "model.model_version", name) in report.mapped
