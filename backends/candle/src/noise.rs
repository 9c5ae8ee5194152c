//! The noise of `rejection_verify_seeded` (the CONV-10 exception), seeded
//! and reproducible on every device.
//!
//! Every call draws from its own PCG64 generator seeded with `seed`, on the
//! host, and uploads the noise once. candle offers no per-call generator on
//! any device: on CUDA, `Device::set_seed` replaces the cuRAND generator that
//! every clone of the `Device` shares (reseeding it per call would change the
//! draws of every other user of the device, which BACKEND-5 forbids), and on
//! the CPU `set_seed` is an error and `Tensor::rand` reads an OS-seeded
//! thread-local generator. A per-call host stream has neither problem, and a
//! failing statistical check can be rerun from its seed on any device.
//!
//! All noise of a batch is drawn from one stream, one tensor at a time in
//! row-major order, so every row reads its own segment and rows are
//! independent (STAT-8 checks it).

use candle_core::{DType, Device, Result, Tensor};
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64;

use crate::verify::Draw;

/// Exp(1) quantile of the midpoint of the first cell of a 2^-53 uniform
/// grid: where `u = 0` lands instead of at 0, which SAMPLE-2 forbids.
const EXP_FLOOR: f64 = 5.551115123125783e-17; // 2^-54

/// `-ln(1 - u)` of a uniform in [0, 1), the one value 0 moved to [`EXP_FLOOR`].
fn exp_from_uniform(u: &Tensor) -> Result<Tensor> {
    u.affine(-1.0, 1.0)?.log()?.neg()?.maximum(EXP_FLOOR)
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

/// Accept uniforms `[B, k]` (f32 in [0, 1)) and draw noise (`[B, k+1]`
/// uniforms, or `[B, k+1, V]` Exp(1) values made from f64 uniforms, so that
/// the tail is not cut at ln 2^24) for one seeded verify, on `dev`.
pub fn rejection_noise(dev: &Device, seed_value: u64, (batch, k, vocab): (usize, usize, usize), method: specdec_backend::DrawMethod) -> Result<(Tensor, DrawNoise)> {
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
        for method in [specdec_backend::DrawMethod::InverseCdf, specdec_backend::DrawMethod::ExponentialRace] {
            let (u, draw) = rejection_noise(&Device::Cpu, 3, (16, 4, 8), method)?;
            assert!(u.flatten_all()?.to_vec1::<f32>()?.iter().all(|&x| (0.0..1.0).contains(&x)));
            match draw {
                DrawNoise::InverseCdf(v) => assert!(v.flatten_all()?.to_vec1::<f32>()?.iter().all(|&x| (0.0..1.0).contains(&x))),
                DrawNoise::Race(e) => assert!(e.flatten_all()?.to_vec1::<f32>()?.iter().all(|&x| x.is_finite() && x > 0.0)),
            }
        }
        Ok(())
    }

    #[test]
    fn a_zero_uniform_maps_into_range() -> Result<()> {
        let e = exp_from_uniform(&Tensor::new(&[0f64, 0.5], &Device::Cpu)?)?.to_vec1::<f64>()?;
        assert_eq!(e[0], EXP_FLOOR);
        assert!((e[1] - std::f64::consts::LN_2).abs() < 1e-15);
        Ok(())
    }
}
