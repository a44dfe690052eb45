"""Prompt templates: text files in ``templates/`` with ``{{name}}`` placeholders.

:func:`fill` substitutes in one pass, so text inserted for one placeholder (model output, code with braces) is
never scanned for further placeholders. A placeholder without a value is a programming error (KeyError).
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

from stark_ray.eval.backends import backend_class

ROLES = ("plan", "code", "debug", "single")
_PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")


@cache
def load(name: str) -> str:
    """The text of ``templates/<name>.txt``."""
    return (files("stark_ray.prompts") / "templates" / f"{name}.txt").read_text(encoding="utf-8")


def placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(text))


def fill(template: str, /, **values: str) -> str:
    """``templates/<template>.txt`` with every ``{{key}}`` replaced by ``values[key]``."""
    text = load(template)

    def _sub(m: re.Match[str]) -> str:
        return values[m.group(1)]

    return _PLACEHOLDER.sub(_sub, text).strip() + "\n"


DEVICES = ("cuda", "cpu")  # each has its rules (templates/rules_<device>.txt): no GPU rule is shown on a CPU


def system_prompt(role: str, backend: str, device: str = "") -> str:
    """The system prompt of an agent role for a target backend on a device ("cuda", "cpu"; "": the backend's usual
    one)."""
    if role not in ROLES:
        raise ValueError(f"unknown agent role {role!r}; choose one of {', '.join(ROLES)}")
    cls = backend_class(backend)  # ValueError for a backend that is not offered
    device = device or cls.usual_device
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    rules = fill("candidate_format", device_rules=load(f"rules_{device}").strip()).strip()
    return fill(f"role_{role}", target=cls.target, format=rules, backend=cls.prompt_section())
