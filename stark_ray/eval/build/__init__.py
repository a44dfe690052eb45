"""Builds of candidates' extensions: the cache keyed by what was built (:mod:`.cache`, with precompiled headers:
:mod:`.pch`), the service's compile processes (:mod:`.pool`), builds made outside an isolated candidate's reach
(:mod:`.builder`) and published into the cache by the trusted side (:mod:`.publish`), under file locks
(:mod:`.locks`)."""
