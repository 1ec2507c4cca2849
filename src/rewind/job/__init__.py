"""Backfill jobs: spec → plan → run. See docs/design-backfill.md for the contracts."""
