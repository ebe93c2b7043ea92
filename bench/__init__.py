"""kvstore benchmarks: `python -m bench [smoke|quick|full]` (see README, "Benchmarks")."""
