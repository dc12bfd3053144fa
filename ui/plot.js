// plot.js: a tiny SVG line plot for the console's time series.
//
// Plot.lines(el, {series: [{name, color, dashed, points: [[tMillis, y], …]}],
//                 yMax, yFmt, empty})
// replaces el's content with a plot of every series over a shared time axis
// (y from 0 to yMax, or to the largest value), with grid lines, tick labels
// and a legend. Names and labels are set as text, never as markup.
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const H = 240, L = 64, R = 14, T = 12, B = 28;

  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // clock labels a time: HH:MM:SS, with tenths when the axis spans
  // less than ten seconds.
  function clock(ms, span) {
    const d = new Date(ms);
    const s = d.toTimeString().slice(0, 8);
    return span < 10000 ? s + "." + Math.floor(d.getMilliseconds() / 100) : s;
  }

  // niceMax rounds v up to 1, 2 or 5 times a power of ten.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function lines(container, opts) {
    container.textContent = "";
    const series = (opts.series || []).filter(s => s.points.length > 0);
    const n = Math.max(0, ...series.map(s => s.points.length));
    if (n < 2) {
      const p = document.createElement("div");
      p.className = "empty";
      p.textContent = opts.empty || "Collecting samples…";
      container.appendChild(p);
      return;
    }
    let t0 = Infinity, t1 = -Infinity, ymax = 0;
    for (const s of series) for (const [t, y] of s.points) {
      t0 = Math.min(t0, t); t1 = Math.max(t1, t);
      if (isFinite(y)) ymax = Math.max(ymax, y);
    }
    if (t1 <= t0) t1 = t0 + 1;
    // As wide as the container, so text keeps its size at any width.
    const W = Math.max(420, Math.round(container.clientWidth || 640));
    const top = opts.yMax !== undefined ? opts.yMax : niceMax(ymax);
    const fmt = opts.yFmt || (v => String(v));
    const x = t => L + (t - t0) / (t1 - t0) * (W - L - R);
    const y = v => T + (1 - Math.min(v, top) / top) * (H - T - B);

    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
    svg.appendChild(el("title", {}, opts.title || "time series"));
    for (let i = 0; i <= 4; i++) {
      const v = top * i / 4, yy = y(v);
      svg.appendChild(el("line", {x1: L, x2: W - R, y1: yy, y2: yy, stroke: i ? "#e5e9ef" : "#94a3b8", "stroke-width": 1}));
      svg.appendChild(el("text", {x: L - 6, y: yy + 4, "text-anchor": "end", "font-size": 11, fill: "#64748b"}, fmt(v)));
    }
    for (let i = 0; i <= 4; i++) {
      const t = t0 + (t1 - t0) * i / 4;
      svg.appendChild(el("text", {x: x(t), y: H - 8, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle", "font-size": 11, fill: "#64748b"}, clock(t, t1 - t0)));
    }
    for (const s of series) {
      let d = "", pen = false;
      for (const [t, v] of s.points) {
        if (!isFinite(v)) { pen = false; continue; }
        d += (pen ? "L" : "M") + x(t).toFixed(1) + " " + y(v).toFixed(1);
        pen = true;
      }
      const attrs = {d, fill: "none", stroke: s.color, "stroke-width": 2, "stroke-linejoin": "round", "data-series": s.name};
      if (s.dashed) attrs["stroke-dasharray"] = "6 4";
      if (d) svg.appendChild(el("path", attrs));
    }
    container.appendChild(svg);
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of series) {
      const span = document.createElement("span");
      span.dataset.series = s.name;
      const sw = document.createElement("i");
      sw.style.backgroundColor = s.color;
      if (s.dashed) sw.className = "dashed";
      span.appendChild(sw);
      const last = s.points[s.points.length - 1][1];
      span.appendChild(document.createTextNode(s.name + (isFinite(last) ? " — now " + fmt(last) : "")));
      legend.appendChild(span);
    }
    container.appendChild(legend);
  }

  window.Plot = {lines, niceMax};
})();
