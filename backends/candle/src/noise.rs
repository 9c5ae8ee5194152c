//! The noise of `rejection_verify_seeded` (the CONV-10 exception), seeded
//! and reproducible on every device.
//!
//! On CUDA it comes from candle's own generator: `Device::set_seed` replaces
//! the device's cuRAND generator (XORWOW), which every clone of the `Device`
//! shares (so seeding affects other users of the device), and `Tensor::rand`
//! draws from it. candle cannot seed its CPU generator (`set_seed` returns an
//! error; `Tensor::rand` uses rand's OS-seeded thread-local generator), so on
//! the CPU the noise is drawn by PCG64 seeded with `seed` and built into
//! tensors once: a failing statistical check can then be rerun from its seed.
//!
//! All noise of a batch is drawn at once, one tensor at a time in row-major
//! order, so every row reads its own segment of the stream and rows are
//! independent.

use candle_core::{DType, Device, Result, Shape, Tensor};
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;

use crate::verify::Draw;

/// Exp(1) quantile of the midpoint of the first cell of a 2^-53 uniform
/// grid: where `u = 0` lands instead of at 0, which SAMPLE-2 forbids.
const EXP_FLOOR: f64 = 5.551115123125783e-17; // 2^-54

/// Seeds the device's generator (CUDA; the CPU path never calls this).
pub fn seed(dev: &Device, seed: u64) -> Result<()> {
    dev.set_seed(seed)
}

/// Uniforms in [0, 1), f32. cuRAND returns (0, 1]; `u - floor(u)` folds 1.0
/// onto 0.0 (the grid stays uniform) and leaves [0, 1) unchanged.
pub fn uniforms(dev: &Device, shape: impl Into<Shape>) -> Result<Tensor> {
    fold_unit(&Tensor::rand(0f32, 1f32, shape, dev)?)
}

fn fold_unit(u: &Tensor) -> Result<Tensor> {
    u - u.floor()?
}

/// `-ln(1 - u)` of a folded uniform, the one value 0 moved to [`EXP_FLOOR`].
fn exp_from_uniform(u: &Tensor) -> Result<Tensor> {
    fold_unit(u)?.affine(-1.0, 1.0)?.log()?.neg()?.maximum(EXP_FLOOR)
}

/// Exp(1) noise, finite and > 0, f32. Drawn from f64 uniforms so that the
/// tail is not cut at ln 2^24 and `u = 0` has probability 2^-53; then
/// `-ln(1 - u)` with the one value 0 moved to [`EXP_FLOOR`].
pub fn exponentials(dev: &Device, shape: impl Into<Shape>) -> Result<Tensor> {
    exp_from_uniform(&Tensor::rand(0f64, 1f64, shape, dev)?)?.to_dtype(DType::F32)
}

/// Owned draw noise of a seeded verify.
pub enum DrawNoise {
    InverseCdf(Tensor),
    Race(Tensor),
}

impl DrawNoise {
    pub fn as_draw(&self) -> Draw<'_> {
        match self {
            DrawNoise::InverseCdf(v) => Draw::InverseCdf(v),
            DrawNoise::Race(e) => Draw::Race(e),
        }
    }
}

/// Accept uniforms `[B, k]` and draw noise (`[B, k+1]` uniforms or
/// `[B, k+1, V]` exponentials) for one seeded verify.
pub fn rejection_noise(dev: &Device, seed_value: u64, (batch, k, vocab): (usize, usize, usize), method: specdec_backend::DrawMethod) -> Result<(Tensor, DrawNoise)> {
    if dev.is_cpu() {
        return host_noise(dev, seed_value, (batch, k, vocab), method);
    }
    seed(dev, seed_value)?;
    let accept = uniforms(dev, (batch, k))?;
    let draw = match method {
        specdec_backend::DrawMethod::InverseCdf => DrawNoise::InverseCdf(uniforms(dev, (batch, k + 1))?),
        specdec_backend::DrawMethod::ExponentialRace => DrawNoise::Race(exponentials(dev, (batch, k + 1, vocab))?),
    };
    Ok((accept, draw))
}

/// CPU noise from PCG64 seeded with `seed`: f32 uniforms in [0, 1), and
/// Exp(1) values from f64 uniforms through the same transform as on CUDA.
fn host_noise(dev: &Device, seed_value: u64, (batch, k, vocab): (usize, usize, usize), method: specdec_backend::DrawMethod) -> Result<(Tensor, DrawNoise)> {
    let mut rng = Pcg64::seed_from_u64(seed_value);
    let mut uniform = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>()).collect() };
    let accept = Tensor::from_vec(uniform(batch * k), (batch, k), dev)?;
    let draw = match method {
        specdec_backend::DrawMethod::InverseCdf => DrawNoise::InverseCdf(Tensor::from_vec(uniform(batch * (k + 1)), (batch, k + 1), dev)?),
        specdec_backend::DrawMethod::ExponentialRace => {
            let n = batch * (k + 1) * vocab;
            let u: Vec<f64> = (0..n).map(|_| rng.random::<f64>()).collect();
            DrawNoise::Race(exp_from_uniform(&Tensor::from_vec(u, (batch, k + 1, vocab), dev)?)?.to_dtype(DType::F32)?)
        }
    };
    Ok((accept, draw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_noise_is_reproducible_from_the_seed() -> Result<()> {
        let draw = |s| -> Result<Vec<f32>> {
            let (u, _) = rejection_noise(&Device::Cpu, s, (4, 3, 5), specdec_backend::DrawMethod::InverseCdf)?;
            u.flatten_all()?.to_vec1::<f32>()
        };
        assert_eq!(draw(7)?, draw(7)?);
        assert_ne!(draw(7)?, draw(8)?);
        Ok(())
    }

    #[test]
    fn noise_is_in_range() -> Result<()> {
        let u = uniforms(&Device::Cpu, (64, 64))?.flatten_all()?.to_vec1::<f32>()?;
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let e = exponentials(&Device::Cpu, (64, 64))?.flatten_all()?.to_vec1::<f32>()?;
        assert!(e.iter().all(|&x| x.is_finite() && x > 0.0));
        Ok(())
    }

    #[test]
    fn the_edges_of_the_uniform_grid_map_into_range() -> Result<()> {
        // cuRAND may return exactly 1; the CPU generator exactly 0.
        let u = Tensor::new(&[0f64, 1.0, 0.5], &Device::Cpu)?;
        assert_eq!(fold_unit(&u)?.to_vec1::<f64>()?, [0.0, 0.0, 0.5]);
        let e = exp_from_uniform(&u)?.to_vec1::<f64>()?;
        assert_eq!(e[..2], [EXP_FLOOR, EXP_FLOOR]);
        assert!((e[2] - std::f64::consts::LN_2).abs() < 1e-15);
        Ok(())
    }
}
