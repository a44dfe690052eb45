"""Turn a code-writing reply into a candidate module, or a one-line reason why not."""

from __future__ import annotations

from stark_ray.agents.call import Reply, parse_error
from stark_ray.prompts.fences import normalise_newlines, strip_thinking
from stark_ray.prompts.parser import check_no_anchors, extract_code, source_defines_model_new


def candidate_from(role: str, reply: Reply) -> tuple[str | None, str | None]:
    """(source, None) for a usable candidate; (None, error) otherwise.

    Usable: the reply holds a Python module that parses, keeps no anchor marker and defines ``ModelNew``, and
    the reply was not cut at the token limit (a cut reply whose code still parses is missing its end: a kernel
    or a function cut away, and nothing says so).
    """
    if reply.truncated:
        return None, (f"{role}: the reply hit the token limit (max_tokens) and was cut; its code is not "
                      "evaluated")
    text = reply.text or ""
    outcome = extract_code(text)
    if outcome.code is None:
        answer, _ = strip_thinking(normalise_newlines(text))
        anchors = check_no_anchors(answer)
        return None, parse_error(role, anchors or outcome.error or "no code found", reply)
    anchors = check_no_anchors(outcome.code)
    if anchors is not None:
        return None, parse_error(role, anchors, reply)
    if not source_defines_model_new(outcome.code):
        return None, parse_error(role, "the module does not define class ModelNew", reply)
    return outcome.code, None
