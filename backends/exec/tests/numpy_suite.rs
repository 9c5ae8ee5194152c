//! The whole suite (golden, differential, exact, statistical; SUITE-4) on the
//! NumPy adapter through the protocol (PROTO-1 .. PROTO-8, BACKEND-1 ..
//! BACKEND-5): `exec:$SPECDEC_PYTHON adapters/python/numpy_backend.py`.
//! `cargo xtask test` sets `SPECDEC_PYTHON` to its cached NumPy venv; without
//! it every check is reported ignored, with the reason. An adapter that is
//! set up but fails its handshake fails this test (it must not pass silently).

fn make() -> Result<specdec_exec::ExecBackend, String> {
    let Ok(python) = std::env::var("SPECDEC_PYTHON") else {
        return Err("SPECDEC_PYTHON is unset (`cargo xtask test` sets it to a cached NumPy venv)".into());
    };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let cmd = format!("cd '{root}' && exec '{python}' adapters/python/numpy_backend.py");
    match specdec_exec::ExecBackend::new(&cmd) {
        Ok(b) => Ok(b),
        Err(e) => panic!("the NumPy adapter did not start: {e}"),
    }
}

specdec_conformance::conformance_main!(try make(), "tests/numpy_suite.toml");
