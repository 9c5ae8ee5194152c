//! The worked examples of the reference-only algorithms (`fixtures/host/`,
//! CASE-7), one trial per case, through the same judge as the golden cases.

use libtest_mimic::{Arguments, Failed, Trial};
use specdec_conformance::case::parse;
use specdec_conformance::compare::Verdict;
use specdec_conformance::host::check_host_case;
use specdec_conformance::fixtures::HOST_FILES;

fn main() -> std::process::ExitCode {
    let mut trials = Vec::new();
    for (path, text) in HOST_FILES {
        let stem = path.trim_end_matches(".json").to_string();
        match parse(text, std::path::Path::new(path)) {
            Err(e) => trials.push(Trial::test(format!("host/{stem}"), move || Err(Failed::from(e.to_string())))),
            Ok(loaded) => {
                for e in loaded.errors {
                    trials.push(Trial::test(format!("host/{stem}/{}", e.location), move || Err(Failed::from(e.message))));
                }
                for case in loaded.cases {
                    trials.push(Trial::test(format!("host/{stem}/{}", case.id), move || match check_host_case(&case) {
                        Verdict::Pass { .. } => Ok(()),
                        Verdict::Fail(m) | Verdict::NotSupported(m) => Err(Failed::from(m)),
                    }));
                }
            }
        }
    }
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
