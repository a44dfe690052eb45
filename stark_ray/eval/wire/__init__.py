"""The contract between the service, the judge and the worker: the messages (:mod:`.protocol`), the shared buffers
tensors travel in (:mod:`.exchange`, placed by :mod:`.outbox`) and the JSON structures that describe them
(:mod:`.trees`). Every field a process reads from another is checked here; nothing is unpickled."""
