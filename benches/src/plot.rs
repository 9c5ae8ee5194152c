//! Line charts of the report (SVG, plotters): speedup versus k, and
//! acceptance per draft position.

use std::path::Path;

use plotters::prelude::*;

/// One line: its legend and points.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Draws `lines` on one chart with integer x ticks; `reference_y` adds a
/// dashed horizontal line (e.g. speedup 1, plain decoding).
pub fn lines(path: &Path, title: &str, x_desc: &str, y_desc: &str, lines: &[Line], reference_y: Option<f64>) -> Result<(), String> {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let ys = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).chain(reference_y);
    let (x_min, x_max) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let y_max = ys.fold(0.0f64, f64::max);
    if !x_min.is_finite() {
        return Err(format!("nothing to plot in {}", path.display()));
    }
    let root = SVGBackend::new(path, (820, 460)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(14)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d((x_min - 0.3)..(x_max + 0.3), 0f64..(y_max * 1.12).max(1e-9))?;
        chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).x_labels((x_max - x_min) as usize + 1).x_label_formatter(&|x| format!("{}", x.round() as i64)).draw()?;
        if let Some(y) = reference_y {
            chart.draw_series(DashedLineSeries::new(vec![(x_min - 0.3, y), (x_max + 0.3, y)], 6, 4, BLACK.mix(0.6).stroke_width(1)))?;
        }
        for (i, line) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(line.points.clone(), color.stroke_width(2)).point_size(3))?
                .label(line.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
        }
        chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("cannot plot {}: {e}", path.display()))
}
