//! The loss curve of a training run as SVG (plotters).

use std::path::Path;

use plotters::prelude::*;

/// Plots `train` (step, loss) and, when given, `heldout` (step, loss) points.
pub fn loss_curve(path: &Path, title: &str, train: &[(f64, f64)], heldout: &[(f64, f64)]) -> Result<(), String> {
    let x_max = train.iter().chain(heldout).map(|p| p.0).fold(1.0f64, f64::max);
    let y_max = train.iter().chain(heldout).map(|p| p.1).filter(|y| y.is_finite()).fold(0.0f64, f64::max);
    if train.is_empty() {
        return Err(format!("no loss to plot in {}", path.display()));
    }
    let root = SVGBackend::new(path, (820, 460)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let mut chart =
            ChartBuilder::on(&root).caption(title, ("sans-serif", 17)).margin(14).x_label_area_size(36).y_label_area_size(56).build_cartesian_2d(0f64..x_max, 0f64..(y_max * 1.05).max(1e-9))?;
        chart.configure_mesh().x_desc("step").y_desc("weighted cross-entropy (nats)").draw()?;
        let series = [("train (smoothed over 20 steps)", train, BLUE), ("held out", heldout, RED)];
        for (label, points, color) in series {
            if points.is_empty() {
                continue;
            }
            chart.draw_series(LineSeries::new(points.to_vec(), color.stroke_width(2)))?.label(label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
        }
        chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("cannot plot {}: {e}", path.display()))
}
