"""Policy: profiles (the permission matrix), checks before the run, and the decision."""
