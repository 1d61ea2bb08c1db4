//! A plot drawn as SVG with plotters, its polylines turned into paths.

use std::fmt::Write as _;

use super::Plot;

/// Draws a plot as SVG: time since the job's start against the value.
pub fn svg(plot: &Plot) -> String {
    use plotters::prelude::*;
    let mut out = String::new();
    let t0 = plot.points.first().map(|p| p.0).unwrap_or(0.0);
    let data_max = plot.points.iter().map(|p| p.1).fold(0.0, f64::max);
    let top = data_max.max(plot.y_top.unwrap_or(0.0));
    // Bytes in the unit that gives readable ticks.
    let (scale, unit) = match plot.unit.as_str() {
        "bytes" if top >= 1073741824.0 => (1073741824.0, "GiB"),
        "bytes" => (1048576.0, "MiB"),
        u => (1.0, u),
    };
    let span = plot.points.last().map(|p| p.0 - t0).unwrap_or(0.0);
    let (per, x_unit) = match span {
        s if s < 180.0 => (1.0, "seconds"),
        s if s < 3.0 * 3600.0 => (60.0, "minutes"),
        _ => (3600.0, "hours"),
    };
    let pts: Vec<(f64, f64)> = plot
        .points
        .iter()
        .map(|(t, v)| ((t - t0) / per, v / scale))
        .collect();
    let x_max = (span / per).max(1.0 / per);
    let y_max = if top > 0.0 { 1.05 * top / scale } else { 1.0 };
    {
        let root = SVGBackend::with_string(&mut out, (720, 260)).into_drawing_area();
        let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(format!("{} ({unit})", plot.title), ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
            chart
                .configure_mesh()
                .x_desc(format!("{x_unit} since start"))
                .light_line_style(WHITE.mix(0.0))
                .draw()?;
            chart.draw_series(LineSeries::new(pts.iter().copied(), BLUE.stroke_width(2)))?;
            root.present()?;
            Ok(())
        })();
        if let Err(e) = drawn {
            tracing::warn!(plot = plot.title, error = %e, "cannot draw plot");
        }
    }
    polylines_to_paths(&out)
}

/// plotters writes lines as `<polyline points="x,y x,y"/>`; a `<path>` is what every SVG
/// consumer (and our browser test) reads as a drawn line.
fn polylines_to_paths(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg;
    while let Some(i) = rest.find("<polyline") {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find("/>") else {
            out.push_str(tail);
            return out;
        };
        let element = &tail[..end];
        let points = element
            .split("points=\"")
            .nth(1)
            .and_then(|p| p.split('"').next())
            .unwrap_or("");
        let attrs = element
            .trim_start_matches("<polyline")
            .replace(&format!("points=\"{points}\""), "");
        let mut d = String::new();
        for (k, xy) in points.split_whitespace().enumerate() {
            d.push_str(if k == 0 { "M" } else { " L" });
            d.push_str(xy);
        }
        let _ = write!(out, "<path d=\"{d}\"{}/>", attrs.trim_end());
        rest = &tail[end + 2..];
    }
    out.push_str(rest);
    out
}
