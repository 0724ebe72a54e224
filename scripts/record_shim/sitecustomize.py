# Recording shim for scripts/record_recommend_draw.py (on PYTHONPATH, so every interpreter the
# reference starts loads it).
import importlib.abc
import importlib.machinery
import sys


# RECORD_SHIM_ENGINE_ROUTER=1: `--stack dynamo` replays on the engine stack. The router adapter
# still compiles its search space and the sampler draws as it does under Dynamo; a kv_router
# candidate's placement hook is dropped (it replays round-robin), so only the draw and the
# round_robin candidates' scores are the reference's. The Planner adapter's scaling hook is
# dropped the same way: a planner-enabled candidate replays at its fixed shape, so only the
# draw, the resolved planner sections and the policy-disabled candidates' scores are the
# reference's.
class EngineAsDynamo:
    def __init__(self):
        from aisimulate.runner import EngineReplayRunnerFactory

        self.inner = EngineReplayRunnerFactory()

    def capabilities(self):
        import dataclasses

        from aisimulate.sweeper.replay import HookCapability

        caps = self.inner.capabilities()
        extra = (
            HookCapability("dynamo.router", "placement_policy", 1),
            HookCapability("dynamo.planner", "scaling_policy", 1),
        )
        return dataclasses.replace(caps, supported_hooks=tuple(caps.supported_hooks) + extra)

    def create(self, *args, **kwargs):
        return _Stripped(self.inner.create(*args, **kwargs))


class _Stripped:
    def __init__(self, runner):
        self.runner = runner

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def run(self, spec, *args, **kwargs):
        import dataclasses

        adapters = {k: dataclasses.replace(a, runtime_hooks=()) for k, a in spec.adapters.items()}
        return self.runner.run(dataclasses.replace(spec, adapters=adapters), *args, **kwargs)


class _MainFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "aisimulate.main":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            original = module.resolve_runner_factory
            module.resolve_runner_factory = lambda stack, **kw: (
                EngineAsDynamo() if stack == "dynamo" else original(stack, **kw)
            )

        spec.loader.exec_module = patched
        return spec


import os  # noqa: E402

if os.environ.get("RECORD_SHIM_ENGINE_ROUTER") == "1":
    sys.meta_path.insert(0, _MainFinder())

# RECORD_SHIM_EXTRA_SITE=DIR[:DIR...]: site directories searched after every other one, for the
# Planner adapter's own imports (scikit-learn, kubernetes) that the reference venv lacks; the
# reference's aisimulate is still the one found first.
for extra in filter(None, os.environ.get("RECORD_SHIM_EXTRA_SITE", "").split(":")):
    sys.path.append(extra)
