"""Integration tests: many real runs, crashes of the supervisor, the HumanEval workload."""
