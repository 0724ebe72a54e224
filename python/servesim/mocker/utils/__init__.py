"""Helpers of ``dynamo.mocker.utils`` that servesim needs: ``kv_cache``."""
