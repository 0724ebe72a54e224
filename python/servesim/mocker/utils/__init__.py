"""Helpers of ``dynamo.mocker.utils`` that servesim needs: ``kv_cache`` and
``planner_profiler_perf_data_converter``."""
