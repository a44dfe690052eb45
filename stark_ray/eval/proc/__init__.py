"""The evaluator's processes as their parents hold them: started (:mod:`.launch`, in the environment of
:mod:`.sandbox_env`, isolated by :mod:`.isolation` and :mod:`.jail`), talked to under per-phase time limits
(:mod:`.runner`, :mod:`.child_process`, :mod:`.phase_clock`), kept ready ahead (:mod:`.spares`), tied to their
parents and swept with what they started (:mod:`.lifetime`, :mod:`.process_tree`), their garbage collected
(:mod:`.garbage`), and a lost one told as a result (:mod:`.outcome`)."""
