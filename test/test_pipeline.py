"""Pass registry, option parsing, textual pipelines, and crash isolation."""
from __future__ import annotations

import os

import pytest

import tracea
from tracea.errors import InternalCompilerError, TraceaError
from tracea.passes import PASSES, PIPELINES, describe, parse_pipeline, run_pipeline
from tracea.passes.lower_to_linalg import LowerToLinalgPass

CRASHING_INPUT = """func.func @store_i1(%m: memref<4xi1>, %v: i1) {
  %c0 = arith.constant 0 : index
  memref.store %v, %m[%c0] : memref<4xi1>
  return
}"""


def test_pipeline_mixes_tracea_and_upstream_passes():
    p = parse_pipeline("builtin.module(tracea-lower-to-linalg{strategy=reference}, canonicalize, func.func(cse))")
    assert p.elements == (LowerToLinalgPass("reference"), "canonicalize", "func.func(cse)")
    assert p.text() == "builtin.module(tracea-lower-to-linalg, canonicalize, func.func(cse))"


def test_named_pipelines_expand():
    p = parse_pipeline("tracea-cpu")
    names = [e if isinstance(e, str) else e.NAME for e in p.elements]
    assert names[:7] == ["tracea-verify", "tracea-widen-i1", "tracea-raise-linalg", "canonicalize",
                         "tracea-select-variant", "tracea-cpu-conv", "tracea-cpu-kernels"]
    assert names.count("tracea-cpu-tile-linalg") == 2  # on tensors, then the copies bufferization made
    assert "tracea-cpu-abi" in names and "reconcile-unrealized-casts" in names


@pytest.mark.parametrize("text,message", [
    ("tracea-lower-to-linalg{strategy=fast}", "must be one of reference; got 'fast'"),
    ("tracea-lower-to-linalg{bogus=1}", "has no option 'bogus'; its options: strategy"),
    ("tracea-lower-to-linalg{strategy}", "expected key=value"),
    ("builtin.module(canonicalize", "unbalanced"),
    ("func.func(tracea-verify)", "Tracea passes run on the whole module"),
])
def test_pipeline_errors(text, message):
    with pytest.raises(TraceaError, match=message.replace("(", r"\(").replace("{", r"\{")):
        parse_pipeline(text)


def test_every_pass_is_described():
    text = describe()
    for name in list(PASSES) + list(PIPELINES):
        assert name in text


def test_run_pipeline_returns_diagnostics_for_bad_input():
    result = run_pipeline("func.func @f( {", parse_pipeline("canonicalize"), source_name="bad.mlir")
    assert not result.ok
    assert result.diagnostics[0].file == "bad.mlir" and result.diagnostics[0].line == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="crash isolation needs os.fork")
def test_llvm_abort_is_an_internal_compiler_error_and_the_caller_survives(crash_dir):
    with pytest.raises(InternalCompilerError) as e:
        run_pipeline(CRASHING_INPUT, parse_pipeline("finalize-memref-to-llvm"), source_name="crash.mlir")
    message = str(e.value)
    assert "killed by signal 6 (SIGABRT)" in message
    assert "Assertion `integralElementType.getWidth() >= 8' failed." in message
    reproducer = e.value.reproducer
    assert reproducer and reproducer.startswith(str(crash_dir))
    saved = open(reproducer).read()
    assert "memref.store %v, %m[%c0] : memref<4xi1>" in saved
    assert "// pipeline: builtin.module(finalize-memref-to-llvm)" in saved
    # ... and this process still works:
    assert tracea.compile("func.func @ok(%x: tensor<2xf32>) -> tensor<2xf32> { "
                          "%y = \"tracea.softmax\"(%x) : (tensor<2xf32>) -> tensor<2xf32> "
                          "return %y : tensor<2xf32> }") is not None


def test_in_process_mode_gives_the_same_result(monkeypatch):
    text = 'func.func @f(%x: tensor<3xf32>) -> tensor<3xf32> { %y = "tracea.softmax"(%x) : (tensor<3xf32>) -> tensor<3xf32> return %y : tensor<3xf32> }'
    forked = run_pipeline(text, parse_pipeline("tracea-to-linalg"), isolate=True)
    in_process = run_pipeline(text, parse_pipeline("tracea-to-linalg"), isolate=False)
    assert forked.ok and in_process.ok and forked.text == in_process.text


SOFTMAX = ('func.func @f(%x: tensor<3xf32>) -> tensor<3xf32> { %y = "tracea.softmax"(%x) : (tensor<3xf32>) -> '
           'tensor<3xf32> return %y : tensor<3xf32> }')


def _environment_value(module) -> bytes:  # a `finish` step: what the compiler process sees
    return os.environ.get("TRACEA_TEST_VALUE", "").encode()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the compiler process needs os.fork")
def test_compiles_reuse_one_compiler_process_and_a_crash_replaces_it(crash_dir):
    from tracea.passes.isolation import compiler_process_id

    first = run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True)
    pid = compiler_process_id()
    second = run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True)
    assert first.ok and second.ok and first.text == second.text
    assert pid is not None and pid != os.getpid() and compiler_process_id() == pid
    with pytest.raises(InternalCompilerError, match="SIGABRT"):
        run_pipeline(CRASHING_INPUT, parse_pipeline("finalize-memref-to-llvm"), isolate=True)
    assert compiler_process_id() is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped, not left a zombie
    assert run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True).text == first.text
    assert compiler_process_id() not in (None, pid)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the compiler process needs os.fork")
def test_compiler_process_sees_the_current_environment_and_takes_any_finish_step(monkeypatch):
    pipeline = parse_pipeline("tracea-to-linalg")
    for value in ("one", "two"):
        monkeypatch.setenv("TRACEA_TEST_VALUE", value)
        assert run_pipeline(SOFTMAX, pipeline, isolate=True, finish=_environment_value).artifact == value.encode()
    # a step that does not pickle runs in a child forked for it
    assert run_pipeline(SOFTMAX, pipeline, isolate=True, finish=lambda module: b"lambda").artifact == b"lambda"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the compiler process needs os.fork")
def test_a_forked_copy_of_the_caller_starts_its_own_compiler_process():
    from tracea.passes.isolation import compiler_process_id

    expected = run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True).text
    parent_compiler = compiler_process_id()
    pid = os.fork()
    if pid == 0:
        ok = (compiler_process_id() is None
              and run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True).text == expected
              and compiler_process_id() not in (None, parent_compiler))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert compiler_process_id() == parent_compiler
    assert run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True).text == expected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the compiler process needs os.fork")
def test_the_compiler_process_holds_no_pipe_of_the_caller():
    """A pipe the caller has open when the compiler process is forked (as subprocess.Popen has,
    between creating its child and that child's exec) must reach end-of-file once the caller
    closes it: a copy kept by the long-lived compiler process would hang Popen for ever."""
    import select

    from tracea.passes import isolation
    with isolation._process_lock:
        if isolation._process is not None:
            isolation._process.close()
            isolation._process = None
    read_end, write_end = os.pipe()
    try:
        assert run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True).ok  # forks one now
        assert isolation.compiler_process_id() is not None
        os.close(write_end)
        ready, _, _ = select.select([read_end], [], [], 10)
        assert ready and os.read(read_end, 1) == b""
    finally:
        os.close(read_end)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the compiler process needs os.fork")
def test_the_compiler_process_needs_no_temporary_directory(monkeypatch, crash_dir):
    """With no usable temporary directory (a full disk: the fuzzer's run filled one), the
    compiler process still starts and still reports an abort with its assertion (its stderr is
    kept in memory); before, tempfile's error ended tracea-opt in a traceback."""
    import tempfile

    from tracea.passes import isolation

    def full_disk(*args, **kwargs):
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "mkstemp", full_disk)
    with isolation._process_lock:
        if isolation._process is not None:
            isolation._process.close()
            isolation._process = None
    assert run_pipeline(SOFTMAX, parse_pipeline("tracea-to-linalg"), isolate=True).ok
    with pytest.raises(InternalCompilerError, match="integralElementType.getWidth"):
        run_pipeline(CRASHING_INPUT, parse_pipeline("finalize-memref-to-llvm"), isolate=True)
