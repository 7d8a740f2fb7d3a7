"""One turn: the turn driver, its seams, in-turn native compaction, budget and cost."""
