// The stepper's drawing (part of stepper.js's module, joined by static_html.module_source): the inlined SVG of each
// pass, its zoom and pan (view.x, view.y, view.scale), and moving it so that what matters is in view. `s` holds the
// elements and the state render() shares with its parts.

function viewParts(s) {
  const { passes, root, canvas, viewport, follow } = s;
  const svgs = passes.map(() => null);

  function svgOf(p) {
    if (svgs[p] === null) { svgs[p] = decodeSvg(passes[p].svg); }
    return svgs[p];
  }

  function size() {
    const svg = canvas.querySelector("svg");
    if (!svg) { return { w: 1, h: 1 }; }
    const length = (name) => {
      const text = svg.getAttribute(name) || "1";
      return (parseFloat(text) || 1) * (text.endsWith("pt") ? 4 / 3 : 1); // Graphviz sizes are in points
    };
    return { w: length("width"), h: length("height") };
  }

  function apply() {
    canvas.style.transform = "translate(" + s.view.x + "px, " + s.view.y + "px) scale(" + s.view.scale + ")";
    // text that would be drawn below MIN_TEXT_PX is hidden: an overview shows the shape, not unreadable labels
    root.classList.toggle("al-overview", s.view.scale * FONT_PX < MIN_TEXT_PX);
    // a folded group's name has its own size: hidden too while it would be drawn below MIN_TEXT_PX
    canvas.querySelectorAll("text.al-group-name").forEach((name) => {
      name.classList.toggle("al-tiny", parseFloat(name.getAttribute("font-size")) * 4 / 3 * s.view.scale < MIN_TEXT_PX);
    });
    root.setAttribute("data-scale", s.view.scale.toFixed(3));
  }

  function fitScale() {
    const { w, h } = size();
    const width = viewport.clientWidth || 800;
    const height = viewport.clientHeight || 600;
    return Math.min(width / w, height / h, 1.5);
  }

  function fit() {
    const { w, h } = size();
    s.view.scale = fitScale();
    s.view.x = ((viewport.clientWidth || 800) - w * s.view.scale) / 2;
    s.view.y = ((viewport.clientHeight || 600) - h * s.view.scale) / 2;
    apply();
  }

  function readable() {
    // the drawing at its natural size or smaller to fit, but never so small that labels drop below MIN_TEXT_PX
    const { w, h } = size();
    const width = viewport.clientWidth || 800;
    const height = viewport.clientHeight || 600;
    s.view.scale = Math.max(Math.min(width / w, height / h, 1), MIN_TEXT_PX / FONT_PX);
    s.view.x = w * s.view.scale <= width ? (width - w * s.view.scale) / 2 : 0;
    s.view.y = h * s.view.scale <= height ? (height - h * s.view.scale) / 2 : 0;
    apply();
  }

  function zoomAt(factor, cx, cy) {
    const scale = Math.min(4, Math.max(0.05, s.view.scale * factor));
    const x = cx === undefined ? (viewport.clientWidth || 800) / 2 : cx;
    const y = cy === undefined ? (viewport.clientHeight || 600) / 2 : cy;
    s.view.x = x - (x - s.view.x) * (scale / s.view.scale);
    s.view.y = y - (y - s.view.y) * (scale / s.view.scale);
    s.view.scale = scale;
    apply();
  }

  function clampView() {
    // after an automatic move: a drawing larger than the view fills it (no empty band beside its edge while more
    // of it is hidden on the other side); a smaller one is centred
    const { w, h } = size();
    const width = viewport.clientWidth || 800;
    const height = viewport.clientHeight || 600;
    const [dw, dh] = [w * s.view.scale, h * s.view.scale];
    s.view.x = dw <= width ? (width - dw) / 2 : Math.min(0, Math.max(width - dw, s.view.x));
    s.view.y = dh <= height ? (height - dh) / 2 : Math.min(0, Math.max(height - dh, s.view.y));
  }

  function bringIntoView(ids, margin) {
    // the boxes of `ids` (the first one first) in view at a readable zoom: centred when they are not, then clamped
    const targets = ids.filter((id) => id).map((id) => canvas.querySelector("#" + (s.hiddenIn[id] || id))).filter((t) => t);
    if (!targets.length) { return; }
    if (s.view.scale * FONT_PX < MIN_TEXT_PX) { s.view.scale = MIN_TEXT_PX / FONT_PX; apply(); }
    const port = viewport.getBoundingClientRect();
    const boxes = targets.map((t) => t.getBoundingClientRect());
    let box = { left: Math.min(...boxes.map((b) => b.left)), right: Math.max(...boxes.map((b) => b.right)),
      top: Math.min(...boxes.map((b) => b.top)), bottom: Math.max(...boxes.map((b) => b.bottom)) };
    if (box.right - box.left > port.width - 2 * margin || box.bottom - box.top > port.height - 2 * margin) {
      box = boxes[0]; // together they do not fit: the first
    }
    if (box.left >= port.left + margin && box.right <= port.right - margin &&
        box.top >= port.top + margin && box.bottom <= port.bottom - margin) { return; }
    s.view.x += port.left + port.width / 2 - (box.left + box.right) / 2;
    s.view.y += port.top + port.height / 2 - (box.top + box.bottom) / 2;
    clampView();
    apply();
  }

  function followCurrent() {
    // the current node; before the first step, the root with the first node to run beside it
    const steps = passes[s.pass].steps;
    const node = steps[s.step].node;
    if (!follow.checked) { return; }
    if (node) { bringIntoView([node], 40); return; }
    if (s.step === 0) { bringIntoView([(passes[s.pass].roots || [])[0], steps.length > 1 ? steps[1].node : null], 20); }
  }

  function centreOn(id) {
    bringIntoView([id], 0);
  }

  function showEdges(ids) {
    // a chosen path's arrows in view: module groups holding them opened, the view moved (and zoomed out as far as
    // needed, down to a tenth) so that all of them show, unless they all show already
    const groups = passes[s.pass].groups;
    if (groups) {
      const shut = groups.list.filter((g) => g.edgeSet && ids.some((e) => g.edgeSet.has(e)) &&
        canvas.querySelector("#" + g.id + ".al-collapsed"));
      shut.forEach((g) => { s.opened[g.id] = true; });
      if (shut.length) { s.applyGroups(); }
    }
    const union = () => {
      const boxes = ids.map((id) => canvas.querySelector("#" + id)).filter((g) => g && g.getClientRects().length)
        .map((g) => g.getBoundingClientRect());
      if (!boxes.length) { return null; }
      return { left: Math.min(...boxes.map((b) => b.left)), right: Math.max(...boxes.map((b) => b.right)),
        top: Math.min(...boxes.map((b) => b.top)), bottom: Math.max(...boxes.map((b) => b.bottom)) };
    };
    let box = union();
    if (!box) { return; }
    const port = viewport.getBoundingClientRect();
    const margin = 20;
    if (box.left >= port.left + margin && box.right <= port.right - margin && box.top >= port.top + margin &&
        box.bottom <= port.bottom - margin) { return; }
    const room = Math.min((port.width - 2 * margin) / (box.right - box.left || 1),
      (port.height - 2 * margin) / (box.bottom - box.top || 1));
    if (room < 1) {
      s.view.scale = Math.max(s.view.scale * room, 0.1);
      apply();
      box = union();
    }
    s.view.x += port.left + port.width / 2 - (box.left + box.right) / 2;
    s.view.y += port.top + port.height / 2 - (box.top + box.bottom) / 2;
    apply();
  }

  function topInView(target) { // an opened block's outline is often taller than the view: its name (top) in view
    if (s.view.scale * FONT_PX < MIN_TEXT_PX) { s.view.scale = MIN_TEXT_PX / FONT_PX; apply(); }
    const box = target.getBoundingClientRect();
    const port = viewport.getBoundingClientRect();
    s.view.x += port.left + port.width / 2 - (box.left + Math.min(box.width, port.width - 40) / 2);
    s.view.y += port.top + (box.height > port.height - 40 ? 20 : port.height / 2 - box.height / 2) - box.top;
    apply();
  }

  return { apply, bringIntoView, centreOn, fit, followCurrent, readable, showEdges, size, svgOf, topInView, zoomAt };
}
