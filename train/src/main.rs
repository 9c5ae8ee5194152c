//! `specdec-train`: trains a DFlash draft from `specdec draft-data` output and
//! writes the checkpoint (`config.json`, `model.safetensors`), the training
//! log (`training.json`) and the loss curve (`loss.svg`) into `--out`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use specdec_models::DraftData;
use specdec_models::hf::SaveDtype;
use specdec_train::trainer::{Eval, Progress, TrainConfig, train};

#[derive(Parser)]
#[command(name = "specdec-train", about = "Train a DFlash block draft for a target model (libtorch, on the CPU or a CUDA device)")]
struct Args {
    /// The target: an HF-layout directory or a `.gguf` file.
    #[arg(long)]
    target: PathBuf,
    /// `specdec draft-data --split train` output.
    #[arg(long, required_unless_present = "evaluate")]
    data: Option<PathBuf>,
    /// `specdec draft-data --split heldout` output, for the held-out estimate.
    #[arg(long)]
    heldout: Option<PathBuf>,
    #[arg(long, required_unless_present = "evaluate")]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    #[arg(long, default_value_t = 8)]
    block_size: usize,
    #[arg(long, default_value_t = 1)]
    draft_layers: usize,
    /// The mask token's id (a row of the target's embedding).
    #[arg(long, required_unless_present = "evaluate")]
    mask_token_id: Option<u32>,
    #[arg(long, default_value_t = 8)]
    seqs_per_step: usize,
    #[arg(long, default_value_t = 16)]
    anchors_per_seq: usize,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
    /// Where training runs: `cpu`, `cuda` or `cuda:N` (a CUDA device needs a
    /// libtorch with CUDA: `cargo xtask cuda` builds one such binary).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Instead of training: the held-out estimate of this existing draft
    /// (a checkpoint folder) on `--heldout`, for comparing drafts on the same data.
    #[arg(long)]
    evaluate: Option<PathBuf>,
    /// Tensor dtype of the checkpoint: f32, f16 or bf16.
    #[arg(long, default_value = "f16")]
    dtype: String,
}

struct Bar(ProgressBar);

impl Progress for Bar {
    fn step(&mut self, _: usize, loss: f64) {
        self.0.inc(1);
        self.0.set_message(format!("loss {loss:.3}"));
    }

    fn eval(&mut self, e: &Eval) {
        let line = format!(
            "step {:>5}: held-out loss {:.3}, accepted per block {:.3} (tau {:.3}), per position {:?}",
            e.step,
            e.loss,
            e.accepted_per_block,
            e.tau,
            e.acceptance_per_position.iter().map(|a| (a * 1000.0).round() / 1000.0).collect::<Vec<_>>()
        );
        // A hidden bar (no terminal) prints nothing, so logs get the line directly.
        if self.0.is_hidden() { eprintln!("{line}") } else { self.0.println(line) }
    }
}

fn run(args: Args) -> Result<(), String> {
    let dtype = SaveDtype::parse(&args.dtype).map_err(|e| e.to_string())?;
    let target = specdec_models::load(&args.target).map_err(|e| e.to_string())?.weights;
    if let Some(dir) = &args.evaluate {
        let heldout = args.heldout.as_ref().ok_or("--evaluate needs --heldout")?;
        let draft = specdec_models::load_dflash(dir, &target.config).map_err(|e| e.to_string())?;
        let e = specdec_train::trainer::evaluate_draft(&target, &draft, &DraftData::read(heldout).map_err(|e| e.to_string())?, &args.device)?;
        println!(
            "specdec-train: {} on {}: held-out loss {:.3}, tau {:.3} ({:.3} drafts accepted per block of {}, {} blocks), per position {:?}",
            dir.display(),
            heldout.display(),
            e.loss,
            e.tau,
            e.accepted_per_block,
            draft.config().block_size - 1,
            e.blocks,
            e.acceptance_per_position.iter().map(|a| (a * 1000.0).round() / 1000.0).collect::<Vec<_>>()
        );
        return Ok(());
    }
    let (Some(data), Some(out)) = (&args.data, &args.out) else { return Err("training needs --data and --out".into()) };
    let data = DraftData::read(data).map_err(|e| e.to_string())?;
    let heldout = args.heldout.as_ref().map(DraftData::read).transpose().map_err(|e| e.to_string())?;
    let cfg = TrainConfig {
        block_size: args.block_size,
        draft_layers: args.draft_layers,
        mask_token_id: args.mask_token_id.ok_or("training needs --mask-token-id")?,
        steps: args.steps,
        seqs_per_step: args.seqs_per_step,
        anchors_per_seq: args.anchors_per_seq,
        lr: args.lr,
        seed: args.seed,
        threads: args.threads,
        eval_every: args.eval_every,
        device: args.device,
        ..TrainConfig::default()
    };
    let bar = ProgressBar::new(cfg.steps as u64)
        .with_style(ProgressStyle::with_template("{prefix:>8} [{bar:30}] {pos}/{len} steps {elapsed}<{eta} {wide_msg}").expect("valid template").progress_chars("=> "));
    bar.set_prefix("train");
    let mut progress = Bar(bar);
    let (draft, log) = train(&target, &data, heldout.as_ref(), &cfg, &mut progress)?;
    progress.0.finish();
    specdec_models::export_dflash(&draft, out, dtype).map_err(|e| e.to_string())?;
    let log_path = out.join("training.json");
    std::fs::write(&log_path, serde_json::to_string_pretty(&log).map_err(|e| e.to_string())? + "\n").map_err(|e| format!("{}: {e}", log_path.display()))?;
    // The per-step loss is noisy (a batch of 8 sequences): plot a running mean.
    let smoothed: Vec<(f64, f64)> =
        log.loss.iter().enumerate().map(|(i, _)| (i as f64 + 1.0, log.loss[i.saturating_sub(19)..=i].iter().sum::<f64>() / (i - i.saturating_sub(19) + 1) as f64)).collect();
    let heldout_points: Vec<(f64, f64)> = log.evals.iter().map(|e| (e.step as f64, e.loss)).collect();
    specdec_train::plot::loss_curve(&out.join("loss.svg"), "DFlash draft training loss", &smoothed, &heldout_points)?;
    let last = log.evals.last();
    println!(
        "specdec-train: {} steps in {:.0} s; {}; checkpoint, training.json and loss.svg in {}",
        cfg.steps,
        log.seconds,
        last.map_or("no held-out data".to_string(), |e| format!("held-out tau {:.3} ({:.3} drafts accepted per block of {})", e.tau, e.accepted_per_block, cfg.block_size - 1)),
        out.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("specdec-train: {e}");
            ExitCode::FAILURE
        }
    }
}
