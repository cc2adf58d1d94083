"""The studio's utilities: LoRA files in, LoRA files and checkpoints out; captions for datasets.

Each tool is a function of a validated options object (:mod:`trainer.tools.options`, where
every option is declared once with its default, bounds and help) and returns a report; the CLI
(``python -m trainer <tool> ...``) and the Utilities tab both derive their inputs from those
options and print or show the same report.

    inspect   trainer.tools.inspect      what a LoRA / LyCORIS / embedding file holds
    merge     trainer.tools.merge        LoRAs merged into a base model, saved as a checkpoint
    resize    trainer.tools.resize       a LoRA's rank lowered by SVD (fixed or by kept energy)
    extract   trainer.tools.extract      a LoRA from the difference of a fine-tuned model
    caption   trainer.tools.caption      captions with a transformers image-to-text model
    tag       trainer.tools.caption      tags with a WD14-style ONNX tagger
    doctor    trainer.tools.doctor       what torch sees, whether the device computes, what to fix

inspect, merge, resize and extract read and write the SD families' files and FLUX.1's and
SD 3.5's in their own forms (trainer/tools/flow_targets.py, fused.py, flow_extract.py).
"""
