"""Mixed-precision weight quantization from per-layer sensitivity (issue 18 part 3).

    formats.py  the formats' simulation and torchao export configs (the formats themselves and
                their effective bits: api.finetune.FORMATS, which the planner also reads)
    plan.py     choosing a format per layer under an effective-bits budget (pure)
    run.py      sensitivity on calibration text, export through transformers + torchao, and the
                exported model measured against bf16 (perplexity, weight bytes, tokens/s)

`python -m accelbench.workers.quantize --model DIR --data JSONL --out DIR` runs one; a FinetuneJob of
task quantize runs the same through the fine-tuning entrypoint (workers/finetune/tasks.py).
"""

REPORT_FILE = "quantization-report.json"  # beside the export: the full report with the sensitivity table
