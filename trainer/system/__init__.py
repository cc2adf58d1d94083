"""The machine: the floor that the rest of the trainer stands on.

- :mod:`~trainer.system.device`: device detection (CUDA, ROCm, XPU, MPS, CPU), precision and
  memory; the ONLY module that asks torch about the accelerator;
- :mod:`~trainer.system.probes`: what the system has, asked without torch (rocminfo, nvidia-smi,
  an Intel GPU runtime);
- :mod:`~trainer.system.threads`: CPU threads that follow the machine's load;
- :mod:`~trainer.system.distributed`: ranks, the process group and rank-0-only work;
- :mod:`~trainer.system.speed`: compile and fused-kernel settings;
- :mod:`~trainer.system.lazy_imports`: bitsandbytes imported only when an optimizer needs it;
- :mod:`~trainer.system.quiet`: known-harmless third-party warnings and progress bars at debug
  level, out of the studio's output;
- :mod:`~trainer.system.safe_write`: files written atomically (a temporary file, then
  ``os.replace``), never half-written.

Imports nothing of the trainer but itself (a test checks).
"""
