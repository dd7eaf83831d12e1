"""Static checks of the code before it runs: findings with rule ids and locations."""
