"""The STARK agents: plan (grounded instructions), code, debug, and the single-agent ablation.

Stateless functions, one module each — import the modules (``from stark_ray.agents import code``) and call
``code.plan_and_code``, ``debug.debug``, ``single.single``, ``plan.plan``, ``code.code``. The functions are
not re-exported here because their names equal their modules' names.
"""
