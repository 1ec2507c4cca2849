"""Where a backfill's output goes: staging first, promotion later. One small interface per kind."""
