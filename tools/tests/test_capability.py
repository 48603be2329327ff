import pytest
import torch

from ads_kernel_tools import capability as cap


def test_override_pretends_hopper(monkeypatch):
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "9.0")
    assert cap.sm_version() == (9, 0)
    assert cap.is_hopper() and not cap.is_blackwell()
    assert cap.has_tma() and cap.has_fp8()


def test_override_blackwell_and_ampere(monkeypatch):
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "10.0")
    assert cap.is_blackwell() and not cap.is_hopper() and cap.has_tma()
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "8.0")
    assert not cap.has_tma() and not cap.has_fp8() and cap.sm_version() == (8, 0)
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "8.9")
    assert cap.has_fp8() and not cap.has_tma()


def test_override_none_and_garbage(monkeypatch):
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "none")
    assert cap.sm_version() is None and not cap.has_tma()
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "hopper")
    with pytest.raises(ValueError, match="ADS_SM_OVERRIDE"):
        cap.sm_version()


def test_interpreter_flag(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cap.interpreter_active()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not cap.interpreter_active()
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not cap.interpreter_active()


def test_gluon_sm90_reason(monkeypatch):
    """The interpreter first, then the real device (the override is not trusted: a kernel would be
    launched), then Gluon's presence."""
    t = torch.zeros(1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cap.gluon_sm90_reason(t) == "interpreter"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "9.0")
    assert cap.gluon_sm90_reason(t) == "not an sm_90 GPU"
    assert cap.gluon_sm90_reason(torch.device("cpu")) == "not an sm_90 GPU"  # a device alone
    if torch.cuda.is_available():
        g = torch.zeros(1, device="cuda")
        want = None if torch.cuda.get_device_capability() == (9, 0) else "not an sm_90 GPU"
        if want is None and not cap.gluon_importable():
            want = "triton.experimental.gluon missing"
        assert cap.gluon_sm90_reason(g) == want
        assert cap.gluon_sm90_reason(g.device) == want


def test_require_names_op_need_and_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "8.0")
    with pytest.raises(RuntimeError, match=r"my_op needs .*TMA.*sm_80"):
        cap.require("my_op", tma=True)
    cap.require("my_op", min_sm=(8, 0))  # met: no error
    monkeypatch.setenv(cap.SM_OVERRIDE_ENV, "none")
    with pytest.raises(RuntimeError, match="my_op needs a CUDA GPU"):
        cap.require("my_op")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cap.require("my_op", tma=True, fp8=True)  # waived under the interpreter


def test_num_sms_positive():
    assert cap.num_sms() >= 1


@pytest.mark.gpu
def test_real_gpu_facts():
    assert cap.sm_version() == torch.cuda.get_device_capability()
    assert cap.num_sms() == torch.cuda.get_device_properties(0).multi_processor_count
