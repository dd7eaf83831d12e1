"""Language models for the agent: one small interface, fakes, and provider adapters."""
