"""What the judge and the worker compute alike: the timers and interleaved timing (:mod:`.timing`), how far a
speedup can be trusted (:mod:`.noise`), the comparison of outputs (:mod:`.compare`), seeded inputs
(:mod:`.inputs`), the process state the reference is timed in (:mod:`.process_state`), the device memory budget
(:mod:`.memory`), where one call's GPU time goes (:mod:`.kernel_times`) and where an evaluation's seconds went
(:mod:`.laps`). Nothing here imports the judge or the worker."""
