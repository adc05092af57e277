// The what-if view's browser side (mtp_explorer/ui/whatif_view.py): a status line, a table and a row of plotly
// charts, prepared in the kernel for the settings around the shown one (`frames`: frameKey -> {status, table,
// figures: [JSON]}) and switched here as soon as `n_max`, `p_min` or `n_min` changes (they are linked to the sliders
// in the browser), with no round trip to the kernel. A `message`, where there is one, is the status line. Without a frame for the key the charts are
// folded away (no height, invisible, still as wide, so that plotly draws them at the row's width when they come
// back).
// plotly.js comes as the trait `_plotly_js` (not in this module: anywidget gives a model's module 2 s to load) and
// runs only where no plotly.js is on the page yet.

function plotly(model) {
  if (!window.Plotly) new Function(model.get("_plotly_js"))();
  return window.Plotly;
}

// Key.text in whatif_view.py: n_max / p_min in ten-thousandths / n_min (at most n_max)
function frameKey(model) {
  const n = model.get("n_max");
  return `${n}/${Math.round(model.get("p_min") * 10000)}/${Math.min(model.get("n_min"), n)}`;
}

function render({ model, el }) {
  const Plotly = plotly(model);
  el.classList.add("mtpx-whatif-view");
  const status = document.createElement("div");
  status.className = "mtpx-whatif-status";
  const table = document.createElement("div");
  table.className = "mtpx-whatif-table";
  const row = document.createElement("div");
  row.className = "mtpx-whatif-charts";
  row.style.cssText = "display:flex;width:100%";
  el.append(status, table, row);
  const charts = []; // {div, json}: the JSON each chart shows, so that an unchanged chart is not redrawn
  let folded = null;

  function fold(yes) {
    if (folded === yes) return;
    folded = yes;
    table.style.display = yes ? "none" : "";
    row.style.height = yes ? "0px" : "";
    row.style.overflow = yes ? "hidden" : "";
    row.style.visibility = yes ? "hidden" : "";
    if (!yes) charts.forEach((c) => Plotly.Plots.resize(c.div));
  }

  function draw() {
    const frame = (model.get("frames") || {})[frameKey(model)];
    status.innerHTML = model.get("message") || (frame ? frame.status : "");
    if (!frame) {
      fold(true);
      return;
    }
    table.innerHTML = frame.table;
    frame.figures.forEach((json, i) => {
      if (!charts[i]) {
        const div = document.createElement("div");
        div.style.cssText = "flex:1 1 0;min-width:0";
        row.appendChild(div);
        charts[i] = { div, json: null };
      }
      if (charts[i].json === json) return;
      charts[i].json = json;
      const fig = JSON.parse(json);
      Plotly.react(charts[i].div, fig.data || [], fig.layout || {}, model.get("config"));
    });
    fold(false);
  }

  for (const name of ["n_max", "p_min", "n_min"]) model.on(`change:${name}`, draw);
  model.on("change:frames", draw);
  model.on("change:message", draw);
  draw();
  return () => charts.forEach((c) => Plotly.purge(c.div));
}

export default { render };
