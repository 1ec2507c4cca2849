"""Operations before a production replay: ``rewind rehearse`` (a slice run end to end on a
throw-away target) and ``rewind readiness`` (a scorecard of evidence). Above the job, verify
and doctor layers: a rehearsal walks all of them."""
