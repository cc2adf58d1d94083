"""Train each named family's tiny twin for one step with fp8 base weights in each precision
(fp32, bf16, auto) with gradient checkpointing off and on, in this process, and write
``{family: {combination: "finished" | error}}`` as JSON. tests/test_memory_fp8_paths.py runs it in a
subprocess, so that the CPU kernels can be chosen by the environment (ATEN_CPU_CAPABILITY and
ONEDNN_MAX_CPU_ISA are read once per process).

    python tests/fp8_matrix.py FAMILY[,FAMILY...] WORK_DIR OUT.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))

MODELS = {"sd1": "embedded:tiny-sd15", "sdxl": "embedded:tiny-sdxl",
          "flux1": "embedded:tiny-flux", "sd3": "embedded:tiny-sd3"}
PRECISIONS = ("no", "bf16", "auto")


def main(families: list[str], work: Path, out: Path) -> None:
    from train_helpers import one_image_dataset, small_config

    from trainer.events import ListSink
    from trainer.run.loop import run

    data = one_image_dataset(work / "data")
    results: dict[str, dict[str, str]] = {}
    for family in families:
        for precision in PRECISIONS:
            for checkpointing in (False, True):
                name = f"{precision}-{'checkpointing' if checkpointing else 'plain'}"
                cfg = small_config(
                    work / family / name, data,
                    model={"pretrained_model_name_or_path": MODELS[family],
                           "base_precision": "fp8",
                           "fp8_text_encoders": family in ("flux1", "sd3")},
                    training={"max_train_steps": 1, "mixed_precision": precision,
                              "gradient_checkpointing": checkpointing},
                    network={"network_dim": 4, "network_alpha": 4.0})
                result = run(cfg, ListSink())
                results.setdefault(family, {})[name] = (
                    "finished" if result.status == "finished" else str(result.error))
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1].split(","), Path(sys.argv[2]), Path(sys.argv[3]))
