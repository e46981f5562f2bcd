"""The adapters import their framework themselves, lazily; nothing else in the package does."""

from tests.unit.test_layers import imports, modules

FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning", "accelerate", "torchtitan")


def test_only_the_adapters_import_a_framework():
    wrong = [f"{name}:{line} imports {target}" for name, path in modules()
             if not name.startswith("pytest_reshard.adapters")
             for line, target in imports(path) if target.split(".")[0] in FRAMEWORKS]
    assert not wrong, wrong


def test_an_unsupported_framework_version_is_refused_naming_what_the_adapter_relies_on():
    import pytest

    from pytest_reshard.adapters import hf
    from pytest_reshard.adapters._common import require_version

    with pytest.raises(RuntimeError, match=r"supports transformers >=5.0,<6.0 \(tested with "
                                           r"5.24.0\); this is transformers 4.57.6\. It wraps "
                                           r"Trainer._save_rng_state"):
        require_version("transformers", "4.57.6", hf.SUPPORTED, hf.TESTED, hf._PRIVATE)
    require_version("transformers", "5.24.0", hf.SUPPORTED, hf.TESTED, hf._PRIVATE)


def test_an_unsupported_torchtitan_is_refused_naming_the_private_call():
    import pytest

    from pytest_reshard.adapters import torchtitan
    from pytest_reshard.adapters._common import require_version

    with pytest.raises(RuntimeError, match=r"supports torchtitan >=0.3,<0.4 \(tested with 0.3.0\); "
                                           r"this is torchtitan 0.2.2\. It wraps "
                                           r"CheckpointManager._should_save"):
        require_version("torchtitan", "0.2.2", torchtitan.SUPPORTED, torchtitan.TESTED,
                        torchtitan._PRIVATE)
    require_version("torchtitan", "0.3.0", torchtitan.SUPPORTED, torchtitan.TESTED, torchtitan._PRIVATE)
