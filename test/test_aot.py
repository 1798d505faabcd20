"""Compiled CPU kernels as shared libraries: exported, loaded in a fresh process, called from C."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracea
from tracea import dialects as td


@pytest.fixture(scope="module", params=[1, 2], ids=["1-thread", "2-threads"])
def library(request, tmp_path_factory):
    fn = td.function(td.tensor((37, 29)), td.tensor((29, 45)), td.tensor(45), name="dense")(
        lambda x, w, b: td.fused_gemm(x, w, [td.bias_add(b), td.relu()]))
    path = tmp_path_factory.mktemp(f"aot{request.param}") / "dense.so"
    tracea.compile(fn, threads=request.param).export(path)
    return path


def test_export_writes_library_header_and_description(library):
    assert library.exists()
    header = library.with_name("dense.so.h").read_text()
    assert "int32_t tracea_dense(" in header and "TraceaMemRef2D *x  /* tensor<37x29xf32> */" in header
    assert '"symbol": "tracea_dense"' in library.with_name("dense.so.json").read_text()


def test_load_in_a_fresh_process(library):
    script = textwrap.dedent(f"""
        import numpy as np
        import tracea
        k = tracea.Kernel.load({str(library)!r})
        assert k._entry_on_arrays is not None  # the library's entry taking arrays was found
        rng = np.random.default_rng(0)
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((37, 29), (29, 45), (45,)))
        err = np.abs(k(x, w, b) - np.maximum(x.astype(np.float64) @ w + b, 0)).max()
        print("max error", err)
        assert err < 1e-4
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "max error" in done.stdout


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_call_from_c(library, tmp_path):
    src = tmp_path / "main.c"
    src.write_text(textwrap.dedent(f"""
        #include <stdio.h>
        #include "{library}.h"
        int main(void) {{
            static float x[37 * 29], w[29 * 45], b[45], y[37 * 45];
            for (int i = 0; i < 37 * 29; i++) x[i] = (float)(i % 7) - 3.0f;
            for (int i = 0; i < 29 * 45; i++) w[i] = (float)(i % 5) * 0.25f;
            for (int i = 0; i < 45; i++) b[i] = 1.0f;
            TraceaMemRef2D X = {{x, x, 0, {{37, 29}}, {{29, 1}}}}, W = {{w, w, 0, {{29, 45}}, {{45, 1}}}};
            TraceaMemRef1D B = {{b, b, 0, {{45}}, {{1}}}};
            TraceaMemRef2D Y = {{y, y, 0, {{37, 45}}, {{45, 1}}}};
            if (tracea_dense(&X, &W, &B, &Y) != 0) return 1;
            double sum = 0; for (int i = 0; i < 37 * 45; i++) sum += y[i];
            printf("%.3f\\n", sum);
            return 0;
        }}
    """))
    exe = tmp_path / "main"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src), str(library), f"-Wl,-rpath,{library.parent}"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    x = (np.arange(37 * 29) % 7 - 3.0).reshape(37, 29)
    w = (np.arange(29 * 45) % 5 * 0.25).reshape(29, 45)
    assert float(out) == pytest.approx(np.maximum(x @ w + 1.0, 0).sum(), rel=1e-5)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_the_c_entry_checks_descriptors_and_runs_from_another_directory(library, tmp_path):
    """Moved elsewhere (with the runtime libraries exported beside it), the library still loads:
    no path of this machine in it; a descriptor with other sizes, strides or an offset is refused
    by its position, before anything runs."""
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for item in library.parent.iterdir():
        shutil.copy(item, moved / item.name)
    dynamic = subprocess.run(["readelf", "-d", str(moved / "dense.so")], capture_output=True, text=True).stdout
    assert "$ORIGIN" in dynamic and ".venv" not in dynamic
    src = tmp_path / "main.c"
    src.write_text(textwrap.dedent(f"""
        #include <stdio.h>
        #include "{moved}/dense.so.h"
        int main(void) {{
            static float x[37 * 29], w[29 * 45], b[45], y[37 * 45];
            TraceaMemRef2D X = {{x, x, 0, {{37, 29}}, {{29, 1}}}}, W = {{w, w, 0, {{29, 45}}, {{45, 1}}}};
            TraceaMemRef1D B = {{b, b, 0, {{45}}, {{1}}}};
            TraceaMemRef2D Y = {{y, y, 0, {{37, 45}}, {{45, 1}}}};
            TraceaMemRef2D column_major = {{w, w, 0, {{29, 45}}, {{1, 29}}}};
            TraceaMemRef2D wrong_size = {{x, x, 0, {{29, 37}}, {{37, 1}}}};
            TraceaMemRef1D offset = {{b, b, 1, {{45}}, {{1}}}};
            printf("%d %d %d %d\\n", tracea_dense(&X, &W, &B, &Y), tracea_dense(&X, &column_major, &B, &Y),
                   tracea_dense(&wrong_size, &W, &B, &Y), tracea_dense(&X, &W, &offset, &Y));
            return 0;
        }}
    """))
    exe = tmp_path / "main"
    subprocess.run(["cc", "-o", str(exe), str(src), str(moved / "dense.so"), f"-Wl,-rpath,{moved}"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "2", "1", "3"]


def test_a_loaded_kernel_exports_again(library, tmp_path):
    """A kernel from a library (Kernel.load, or the disk cache) exports by copying that library."""
    load = tracea.Kernel.load
    again = load(library).export(tmp_path / "again.so")
    x, w, b = (np.ones(s, np.float32) for s in ((37, 29), (29, 45), (45,)))
    np.testing.assert_array_equal(load(again)(x, w, b), load(library)(x, w, b))


def test_a_library_exported_again_to_the_same_path_loads_as_the_new_code(tmp_path):
    """dlopen of a path it has loaded returns the old library: load maps a copy named by content."""
    load = tracea.Kernel.load
    path = tmp_path / "k.so"
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    for axis in (0, 1):  # the same signature, other code
        tracea.compile(td.function(td.tensor((3, 3)), name="k")(lambda a: td.softmax(a, axis=axis))).export(path)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        np.testing.assert_allclose(load(path)(x), e / e.sum(axis=axis, keepdims=True), rtol=1e-6)


def test_an_edited_description_is_refused(library, tmp_path):
    import json

    load = tracea.Kernel.load
    for suffix in ("", ".h", ".json"):
        shutil.copyfile(str(library) + suffix, str(tmp_path / "edited.so") + suffix)
    meta = json.loads((tmp_path / "edited.so.json").read_text())
    meta["outputs"][0][0] = [45, 37]
    (tmp_path / "edited.so.json").write_text(json.dumps(meta))
    with pytest.raises(tracea.TraceaError, match="changed after it was written"):
        load(tmp_path / "edited.so")


def test_load_reports_a_missing_description(tmp_path):
    load = tracea.Kernel.load
    with pytest.raises(tracea.TraceaError, match="its description .*json is missing"):
        load(tmp_path / "nothing.so")


def test_export_of_a_bf16_kernel(tmp_path):
    """bf16 conversions are lowered to integer ops, so the library needs no compiler-rt builtin
    (which this machine's C toolchain lacks) and rounds exactly as ml_dtypes does."""
    import ml_dtypes
    load = tracea.Kernel.load
    fn = td.function(td.tensor((4, 8), "bf16"), td.tensor((8, 3), "bf16"), name="bf")(td.gemm)
    tracea.compile(fn).export(tmp_path / "bf.so")
    rng = np.random.default_rng(0)
    # integers: every f32 sum is exact, so only the final rounding to bf16 is compared
    a = rng.integers(-40, 40, (4, 8)).astype(ml_dtypes.bfloat16)
    b = rng.integers(-40, 40, (8, 3)).astype(ml_dtypes.bfloat16)
    expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(load(tmp_path / "bf.so")(a, b), expected)


def test_export_of_a_kernel_calling_the_runner_utilities(tmp_path):
    """Strided copies (here the padded image of the reference convolution) call MLIR's
    memrefCopy: the library links the runtime that provides it."""
    load = tracea.Kernel.load
    fn = td.function(td.tensor((1, 3, 9, 9)), td.tensor((4, 3, 3, 3)), name="conv")(
        lambda x, w: td.conv2d(x, w, stride=2, padding=1))
    kernel = tracea.compile(fn, strategy="reference")
    assert any("c_runner_utils" in lib for lib in kernel.runtime_libraries)
    kernel.export(tmp_path / "conv.so")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(load(tmp_path / "conv.so")(x, w), kernel(x, w), rtol=1e-6)
