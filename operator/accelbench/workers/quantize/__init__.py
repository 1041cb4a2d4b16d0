"""Mixed-precision weight quantization from per-layer sensitivity (issue 18 part 3).

    formats.py  the formats (int4 in groups, int8 per channel, bf16), their effective bits, their
                simulation and their torchao export configs
    plan.py     choosing a format per layer under an effective-bits budget (pure)
    run.py      sensitivity on calibration text, export through transformers + torchao, and the
                exported model measured against bf16 (perplexity, weight bytes, tokens/s)

`python -m accelbench.workers.quantize --model DIR --data JSONL --out DIR` runs one.
"""
