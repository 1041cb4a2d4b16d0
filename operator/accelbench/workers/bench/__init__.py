"""The InferenceBench load generator: `python -m accelbench.workers.bench` (see main.py).

Modules, each with one job: sse (event framing), openai (request bodies, event meaning), records
(one request's timeline -> TTFT/TPOT/ITL), stats (cells), capacity (SLO search, $ per 1M tokens),
prompts (exact-length salted prompts), client (HTTP), runner (closed/open loop), sweep, results.
"""
