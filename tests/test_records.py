"""The Parquet schemas and the plain records are the same data model: no field may be dropped on the way."""

from __future__ import annotations

from search_helpers import hand_built

from stark_ray.records import LLMUsage, attempt_schema, llm_call_schema


def test_attempt_schema_holds_exactly_the_node_record() -> None:
    record = hand_built()[4].to_record()
    assert set(attempt_schema().names) == {"run_id", "task", "seq", "recorded_at"} | set(record)


def test_llm_call_schema_holds_exactly_the_usage_record() -> None:
    record = LLMUsage(role="plan", provider="openai", model="gpt-4o").to_record()
    assert set(llm_call_schema().names) == {"run_id", "task", "seq"} | set(record)
