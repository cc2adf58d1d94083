"""The doctor's lines on bf16 on the CPU: the CPU's bf16 units, a quick matmul in fp32 and in
bf16, and what the training runs' probes measured on this machine (the cache that
``mixed_precision = "auto"`` reads, trainer/system/cpu_bf16.py)."""

from __future__ import annotations

from trainer.system import cpu_bf16

MATMUL = 1024


def cpu_bf16_report() -> str:
    """Plain-text lines in the doctor's layout."""
    units = cpu_bf16.bf16_units()
    fp32_s, bf16_s = cpu_bf16.matmul_seconds(MATMUL)
    unit_text = ", ".join(units) if units else "none (no amx_bf16 / avx512_bf16 / bf16 flag)"
    lines = [f"  {'CPU bf16 units':<20}{unit_text}",
             f"  {'CPU bf16 matmul':<20}{MATMUL}x{MATMUL}, one call: fp32 {fp32_s * 1e3:.1f} ms, "
             f"bf16 {bf16_s * 1e3:.1f} ms ({cpu_bf16.ratio_words(bf16_s / fp32_s)})"]
    results = cpu_bf16.cached_results()
    if not units:
        lines.append("  mixed_precision = 'auto' trains in fp32 on this CPU")
    elif not results:
        lines.append("  No training run has measured bf16 base weights here yet: 'auto' probes "
                     "at the start of a CPU run and keeps the result")
    else:
        lines.append(f"  Measured by training runs (bf16 base weights / fp32, one step; auto "
                     f"picks bf16 below {cpu_bf16.FASTER_BELOW}), kept in {cpu_bf16.cache_file()}:")
        for key, entry in sorted(results.items()):
            ratio = entry.get("ratio") if isinstance(entry, dict) else None
            if isinstance(ratio, (int, float)) and ratio > 0:
                pick = "bf16" if ratio < cpu_bf16.FASTER_BELOW else "fp32"
                lines.append(f"    {key}: {ratio:.2f} ({cpu_bf16.ratio_words(ratio)}) -> {pick}")
    return "\n".join(lines)
