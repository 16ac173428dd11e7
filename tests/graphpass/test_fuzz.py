"""Property-based fuzzing: random DAGs through the default pipeline keep the checker and ORT happy.

300 examples here (derandomized, so CI is reproducible); ``python benchmarks/fuzz.py`` runs
10,000 and saves a minimized reproducer of any failure.
"""

from hypothesis import HealthCheck, assume, given, settings

from graphpass.fuzzing import check, models


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(models())
def test_random_models_optimize_to_equivalent_models(model):
    assume(check(model))  # an input onnxruntime itself cannot run is not counted
