"""Training scripts the kit did not write, run with its resilience (docs/your-script.md)."""
