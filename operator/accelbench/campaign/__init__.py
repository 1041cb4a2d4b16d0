"""BenchCampaign: a matrix of FinetuneJobs and InferenceBenches with a budget, as pure functions
(matrix.py: cells and their stable names; summary.py: repeats, cost of ownership, Pareto front)."""
