//! The latency plot: percentile distribution curves as a self-contained SVG file (written by
//! hand, no font or system library needed; any browser shows it).
//!
//! The x axis is the percentile on the usual HdrHistogram scale, `log10(1 / (1 − q))`, so
//! 90%, 99%, 99.9%, ... are evenly spaced; the y axis is latency in milliseconds on a log scale,
//! so the disk's sub-millisecond baseline and a loaded cluster's tail fit on one picture.

use std::fmt::Write as _;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 600.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f",
];

/// One curve: a label and `(quantile, milliseconds)` points, quantiles ascending.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// `(quantile in [0, 1), latency ms)`.
    pub points: Vec<(f64, f64)>,
}

/// Position of quantile `q` on the x axis: `log10(1 / (1 − q))` (0 at the median's left end).
pub fn x_of_quantile(q: f64) -> f64 {
    let tail = (1.0 - q).max(1e-9);
    -tail.log10()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders `series` as an SVG document titled `title`. Empty series are left out; with no
/// points at all, the axes are drawn over an empty plot.
pub fn render_svg(title: &str, series: &[Series]) -> String {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    let x_max = pts
        .iter()
        .map(|p| x_of_quantile(p.0))
        .fold(2.0f64, f64::max)
        .ceil();
    let positive = |v: f64| v.max(1e-3);
    let y_lo = pts
        .iter()
        .map(|p| positive(p.1))
        .fold(f64::INFINITY, f64::min);
    let y_hi = pts.iter().map(|p| positive(p.1)).fold(0.0f64, f64::max);
    let (dec_lo, dec_hi) = if pts.is_empty() {
        (-1, 2)
    } else {
        (
            y_lo.log10().floor() as i32,
            (y_hi.log10().ceil() as i32).max(y_lo.log10().floor() as i32 + 1),
        )
    };
    let pw = WIDTH - LEFT - RIGHT;
    let ph = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_max * pw;
    let sy =
        |ms: f64| TOP + ph - (positive(ms).log10() - dec_lo as f64) / (dec_hi - dec_lo) as f64 * ph;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="25" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        escape(title)
    );
    // Vertical grid: one line per decade of the tail.
    for k in 0..=(x_max as i32) {
        let x = sx(k as f64);
        let label = match k {
            0 => "0%".to_string(),
            1 => "90%".to_string(),
            _ => format!("{:.*}%", (k - 2) as usize, 100.0 - 100.0 * 10f64.powi(-k)),
        };
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            TOP + ph
        );
        let _ = writeln!(
            o,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#,
            TOP + ph + 18.0
        );
    }
    // Horizontal grid: one line per decade of latency.
    for d in dec_lo..=dec_hi {
        let ms = 10f64.powi(d);
        let y = sy(ms);
        let label = if ms >= 1.0 {
            format!("{ms:.0} ms")
        } else {
            format!("{ms} ms")
        };
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            LEFT + pw
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        o,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">latency (log scale)</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    for (shown, s) in series.iter().filter(|s| !s.points.is_empty()).enumerate() {
        let color = COLORS[shown % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(q, ms)| format!("{:.1},{:.1}", sx(x_of_quantile(q)), sy(ms)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        let ly = TOP + 10.0 + shown as f64 * 20.0;
        let lx = LEFT + pw + 15.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/>"#,
            lx + 25.0
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 32.0,
            ly + 4.0,
            escape(&s.label)
        );
    }
    o.push_str("</svg>\n");
    o
}
