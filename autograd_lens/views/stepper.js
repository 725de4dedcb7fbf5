// autograd_lens stepper: steps through a recorded backward pass in the browser, with no kernel round trip.
//
// One ES module for every front-end. As an anywidget (JupyterLab, Notebook 7, VS Code, Colab, marimo) it
// reads the traits `data` (JSON: passes, steps, cards, tables, questions), `step` and `pass_index`, and
// writes `step` / `pass_index` / `answers` back so Python can read and set them. In a static page
// (nbconvert, Jupyter Book, a saved notebook reopened without its kernel) the same `render` runs against
// a small stand-in model, from the data stored next to it. Each pass's drawing is stored once, as the
// data-URI <img> that shows when scripts are off; here it is decoded and inlined so that CSS can colour it.
//
// frameCss mirrors autograd_lens.views.passview.frame_css: a step changes one <style> block, nothing else.

const CURRENT = "#2563eb";
const DONE = "#16a34a";
const MIN_TEXT_PX = 10; // text is never drawn smaller: below this zoom, labels are hidden (overview)
const FONT_PX = 11 * 4 / 3; // the drawing's labels: Graphviz's 11 pt, in CSS px at zoom 1

function keys(object) {
  return Object.keys(object).sort();
}

export function frameCss(scope, steps, k, asking) {
  // asking: step k's gradient is being predicted, so its arrows and .grad are not shown yet
  const edges = {};
  const grads = {};
  const done = {};
  const last = asking ? k - 1 : k;
  for (let i = 0; i <= last; i++) {
    steps[i].edges.forEach((e) => { edges[e] = 1; });
    steps[i].grads.forEach(([node, text]) => { grads[node] = text; }); // the text .grad holds at this step
  }
  for (let i = 0; i < k; i++) {
    steps[i].done.forEach((d) => { done[d] = 1; });
  }
  const current = steps[k].node;
  if (current) { delete done[current]; }
  const rules = [];
  let list = keys(edges);
  if (list.length) {
    rules.push(list.map((e) => scope + " #" + e + " text").join(", ") + " {visibility: visible}");
    rules.push(list.map((e) => scope + " #" + e + " path").join(", ") + " {stroke: " + DONE + "; stroke-width: 2px}");
  }
  list = keys(grads);
  if (list.length) {
    rules.push(list.map((n) => scope + " #" + n + " ." + grads[n]).join(", ") + " {display: inline}");
    rules.push(list.map((n) => scope + " #" + n + " .al-before").join(", ") + " {display: none}");
  }
  list = keys(done);
  if (list.length) {
    const shapes = [];
    list.forEach((n) => {
      ["polygon", "path", "ellipse"].forEach((s) => { shapes.push(scope + " #" + n + " > " + s); });
    });
    rules.push(shapes.join(", ") + " {stroke: " + DONE + "; stroke-width: 2.5px}");
  }
  if (current) {
    rules.push(["polygon", "path", "ellipse"].map((s) => scope + " #" + current + " > " + s).join(", ") +
      " {stroke: " + CURRENT + "; stroke-width: 5px; stroke-dasharray: 8 3}");
  }
  return rules.join("\n");
}

// Mirrors autograd_lens.views.steps.check_answer: same parsing, tolerance and words.
export function checkAnswer(text, answer, shown) {
  let numbers = (String(text).match(/[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?/g) || []).map(parseFloat);
  if (!numbers.length) { return [false, "Type a number (or a list such as [1, 2]); autograd computed " + shown + "."]; }
  if (numbers.length === 1 && answer.length > 1) { numbers = answer.map(() => numbers[0]); }
  if (numbers.length !== answer.length) {
    return [false, "Not quite: that is " + numbers.length + " number" + (numbers.length !== 1 ? "s" : "") +
      ", the gradient has " + answer.length + ". Autograd computed " + shown + "."];
  }
  const close = numbers.every((a, i) => Math.abs(a - answer[i]) <= 1e-3 + 1e-3 * Math.abs(answer[i]));
  return close ? [true, "Right: autograd computed " + shown + "."] : [false, "Not quite: autograd computed " + shown + "."];
}

// Mirrors autograd_lens.views.steps.check_answers / reveal_text: every part of a question, one verdict.
export function checkAnswers(texts, parts) {
  const results = parts.map((part, i) => checkAnswer(texts[i] || "", part[0], part[1]));
  if (results.length === 1) { return results[0]; }
  return [results.every((r) => r[0]), results.map((r, i) => parts[i][2] + ": " + r[1]).join(" ")];
}

// A wrong prediction leaves the question open: what was off, without autograd's value, so the student can try
// again; "show me" (or a right answer) settles it and says what autograd computed.
export function tryAgainText(texts, parts, tries) {
  const words = parts.map((part, i) => {
    const text = texts[i] || "";
    if (checkAnswer(text, part[0], part[1])[0]) { return "right"; }
    const count = (String(text).match(/[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?/g) || []).length;
    if (!count) { return "type a number (or a list such as [1, 2])"; }
    if (count !== 1 && count !== part[0].length) {
      return "that is " + count + " numbers, the gradient has " + part[0].length;
    }
    return "not quite";
  });
  const said = parts.length === 1 ? words[0] : parts.map((part, i) => part[2] + ": " + words[i]).join("; ");
  return said[0].toUpperCase() + said.slice(1) + " (try " + tries + "). Try again, or press show me to see what " +
    "autograd computed.";
}

export function revealText(parts) {
  if (parts.length === 1) { return "Autograd computed " + parts[0][1] + "."; }
  return parts.map((part) => part[2] + ": autograd computed " + part[1] + ".").join(" ");
}

// The debugging marks (autograd_lens.views.marks): each cut's and NaN origin's reason on hover, and the path
// highlight: a leaf's paths from the root (lens.paths_to), all of them or one, with their contributions.
const PATH = "#7c3aed";

function markTitles(canvas, titles) {
  Object.entries(titles || {}).forEach(([id, text]) => {
    const group = canvas.querySelector("#" + id);
    if (!group) { return; }
    const first = group.firstElementChild;
    if (first && first.tagName.toLowerCase() === "title") { first.textContent += "\n" + text; return; }
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = text;
    group.prepend(title);
  });
}

export function chosenPaths(paths, choice) {
  // choice: "" (off), "i" (every path shown to leaf i), "i.j" (its path j)
  if (!choice || !paths) { return []; }
  const [leaf, one] = choice.split(".");
  const entry = paths[parseInt(leaf, 10)];
  if (!entry) { return []; }
  return one === undefined ? entry.paths : entry.paths.slice(parseInt(one, 10), parseInt(one, 10) + 1);
}

export function pathCss(scope, paths, choice) {
  const chosen = chosenPaths(paths, choice);
  const edges = {};
  chosen.forEach((p) => { p.edges.forEach((e) => { edges[e] = 1; }); });
  const list = keys(edges);
  if (!list.length) { return ""; }
  return [scope + " .al-canvas g.edge {opacity: 0.35}",
    list.map((e) => scope + " #" + e).join(", ") + " {opacity: 1}",
    list.map((e) => scope + " #" + e + " > path").join(", ") + " {stroke: " + PATH + "; stroke-width: 4px}",
    list.map((e) => scope + " #" + e + " > polygon").join(", ") + " {stroke: " + PATH + "; fill: " + PATH + "}"].join("\n");
}

function pathControls(toolbar, root, scope, shown) {
  // a select of each leaf's paths (shown when the pass has them), the chosen paths' contributions below it;
  // shown(edge ids) brings the chosen paths' arrows into view
  const select = make("select", { class: "al-paths", "aria-label": "highlight the paths of a leaf's gradient",
    title: "highlight the paths a leaf's gradient took from the root (the chain rule, path by path)" });
  select.style.display = "none";
  toolbar.appendChild(select);
  const note = make("div", { class: "al-pathnote", "aria-live": "polite" });
  const style = make("style", { class: "al-path-frame" });
  let paths = null;
  const choose = (choice) => {
    select.value = choice;
    style.textContent = pathCss(scope, paths, choice);
    const chosen = chosenPaths(paths, choice);
    note.textContent = chosen.map((p) => p.text + (p.edges.length || p.rest ? "" : " (not on the drawing)")).join("\n");
    note.style.display = chosen.length ? "" : "none";
    root.setAttribute("data-paths", choice);
    if (chosen.length && shown) { shown([].concat(...chosen.map((p) => p.edges))); }
  };
  select.addEventListener("change", () => choose(select.value));
  const setup = (passPaths) => {
    paths = passPaths || null;
    select.replaceChildren(make("option", { value: "" }, "paths: off"));
    (paths || []).forEach((entry, i) => {
      const group = make("optgroup", { label: "paths to " + entry.name + " (" + entry.count + ")" });
      group.appendChild(make("option", { value: String(i) }, "all shown paths to " + entry.name));
      entry.paths.forEach((p, j) => {
        const text = p.text.length > 90 ? p.text.slice(0, 89) + "…" : p.text;
        group.appendChild(make("option", { value: i + "." + j }, p.rest ? text : "path " + (j + 1) + ": " + text));
      });
      select.appendChild(group);
    });
    select.style.display = paths && paths.length ? "" : "none";
    choose("");
  };
  return { note, style, setup, choose };
}

function decodeSvg(src) {
  // a data:image/svg+xml URI, percent-encoded (as stored) or base64
  const comma = src.indexOf(",");
  const head = src.slice(0, comma);
  const body = src.slice(comma + 1);
  if (head.endsWith(";base64")) {
    return new TextDecoder().decode(Uint8Array.from(atob(body), (c) => c.charCodeAt(0)));
  }
  return decodeURIComponent(body);
}

function make(tag, attributes, text) {
  const element = document.createElement(tag);
  Object.entries(attributes || {}).forEach(([name, value]) => { element.setAttribute(name, value); });
  if (text !== undefined) { element.textContent = text; }
  return element;
}

function escapeText(text) {
  const div = document.createElement("div");
  div.textContent = text;
  return div.innerHTML;
}

let counter = 0;

function render({ model, el }) {
  const data = JSON.parse(model.get("data"));
  const passes = data.passes;
  if (!passes.length) { return undefined; }
  const predict = !!data.predict;
  // A document-unique scope: the same output can be shown twice (two views of one widget).
  const scopeId = (data.key || "al") + "-v" + (++counter);
  const scope = "#" + scopeId;
  const root = make("div", { id: scopeId, class: "autograd-lens al-stepper", tabindex: "0", "data-step": "0",
    "aria-roledescription": "backward pass stepper",
    "aria-label": "backward pass stepper: arrow keys or j/k step, + and - zoom, 0 fits" });
  const baseStyle = make("style");
  baseStyle.textContent = data.css.split("{scope}").join(scope);
  const frameStyle = make("style", { class: "al-frame" });
  const groupStyle = make("style", { class: "al-group-frame" });
  const selectStyle = make("style", { class: "al-select-frame" }); // the selected node, upstream and downstream

  // controls
  const toolbar = make("div", { class: "al-controls", role: "toolbar", "aria-label": "step through the backward pass" });
  const button = (go, text, title, parent) => {
    const b = make("button", { type: "button", "data-go": go, title: title, "aria-label": title }, text);
    (parent || toolbar).appendChild(b);
    return b;
  };
  button("first", "|<", "first step (Home)");
  button("prev", "<", "previous step (left arrow or k)");
  const playButton = button("play", "play", "play / pause");
  playButton.setAttribute("aria-pressed", "false");
  button("next", ">", "next step (right arrow or j)");
  button("last", ">|", "last step (End)");
  const slider = make("input", { type: "range", class: "al-slider", min: "0", max: "0", value: "0", "aria-label": "step" });
  toolbar.appendChild(slider);
  const position = make("span", { class: "al-pos", "aria-live": "off" });
  toolbar.appendChild(position);
  let passSelect = null;
  if (passes.length > 1) {
    passSelect = make("select", { class: "al-pass", "aria-label": "backward pass" });
    passes.forEach((p, i) => { passSelect.appendChild(make("option", { value: String(i) }, p.title)); });
    toolbar.appendChild(passSelect);
  }
  // module groups (%%lens --modules): auto (collapsed past ~60 boxes, except around the current step), all open, all closed
  const groupSelect = make("select", { class: "al-groups", "aria-label": "module groups", title: "module groups (click a group's outline or name to open or close it)" });
  [["auto", "groups: auto"], ["open", "groups: all open"], ["closed", "groups: all closed"]].forEach(([value, text]) => {
    groupSelect.appendChild(make("option", { value: value }, text));
  });
  groupSelect.style.display = "none";
  toolbar.appendChild(groupSelect);
  // find a node by what it shows (variable, module path, op); Enter goes to the next match
  const search = make("input", { type: "search", class: "al-search", placeholder: "find: name, module, op",
    "aria-label": "find a node by name, module path or op (Enter: next match, Escape: clear)" });
  toolbar.appendChild(search);
  const zoom = make("span", { class: "al-zoom", role: "group", "aria-label": "zoom" });
  button("zoom-out", "-", "zoom out (-)", zoom);
  button("zoom-in", "+", "zoom in (+)", zoom);
  button("fit", "fit", "fit the whole graph (0)", zoom);
  button("root", "root", "show the root, where the backward pass starts (r)", zoom);
  const followLabel = make("label", { class: "al-follow", title: "keep the current node in view" });
  const follow = make("input", { type: "checkbox", checked: "" });
  followLabel.appendChild(follow);
  followLabel.appendChild(document.createTextNode(" follow"));
  zoom.appendChild(followLabel);
  toolbar.appendChild(zoom);
  if (passes.every((p) => p.steps.length <= 1)) { // a graph to look at (graph(), %lens_graph): nothing to step
    toolbar.querySelectorAll("[data-go=first], [data-go=prev], [data-go=play], [data-go=next], [data-go=last]")
      .forEach((b) => { b.style.display = "none"; });
    slider.style.display = "none";
    position.style.display = "none";
  }

  // the drawing: a viewport that pans and zooms one inlined SVG per pass
  const viewport = make("div", { class: "al-viewport", title: "drag to pan; Ctrl + wheel (or the buttons) to zoom" });
  const canvas = make("div", { class: "al-canvas" });
  viewport.appendChild(canvas);
  const cardBox = make("div", { class: "al-cardbox", "aria-live": "polite" });
  const tableBox = make("div", { class: "al-tablebox" });
  baseStyle.textContent += "\n" + [scope + " .al-found > polygon, " + scope + " .al-found > path, " + scope +
    " .al-found > ellipse {stroke: #db2777; stroke-width: 3px}", scope + " .al-search {width: 12em}",
    scope + " .node {cursor: pointer}"].join("\n");
  const pathsUi = pathControls(toolbar, root, scope, (edges) => showEdges(edges));
  baseStyle.textContent += "\n" + scope + " .al-pathnote {white-space: pre-wrap; font-family: monospace; font-size: 12px; " +
    "border-left: 4px solid " + PATH + "; padding: 2px 8px; margin: 4px 0}";
  root.append(baseStyle, frameStyle, groupStyle, selectStyle, pathsUi.style, toolbar, pathsUi.note, viewport, cardBox, tableBox);
  el.replaceChildren(root);

  const svgs = passes.map(() => null);
  let pass = Math.min(model.get("pass_index") || 0, passes.length - 1);
  let step = 0;
  let timer = null;
  let view = { scale: 1, x: 0, y: 0 };
  let groupMode = "auto";
  let opened = {}; // group id -> true (opened) / false (closed) by a click, for this pass
  let hiddenIn = {}; // node id -> the id of the outermost collapsed group hiding it
  const answered = Object.assign({}, model.get("answers") || {});
  const tries = {}; // "pass:step" -> [wrong tries so far, the last answer's texts], while its question is open

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
    canvas.style.transform = "translate(" + view.x + "px, " + view.y + "px) scale(" + view.scale + ")";
    // text that would be drawn below MIN_TEXT_PX is hidden: an overview shows the shape, not unreadable labels
    root.classList.toggle("al-overview", view.scale * FONT_PX < MIN_TEXT_PX);
    // a folded group's name has its own size: hidden too while it would be drawn below MIN_TEXT_PX
    canvas.querySelectorAll("text.al-group-name").forEach((name) => {
      name.classList.toggle("al-tiny", parseFloat(name.getAttribute("font-size")) * 4 / 3 * view.scale < MIN_TEXT_PX);
    });
    root.setAttribute("data-scale", view.scale.toFixed(3));
  }

  function fitScale() {
    const { w, h } = size();
    const width = viewport.clientWidth || 800;
    const height = viewport.clientHeight || 600;
    return Math.min(width / w, height / h, 1.5);
  }

  function fit() {
    const { w, h } = size();
    view.scale = fitScale();
    view.x = ((viewport.clientWidth || 800) - w * view.scale) / 2;
    view.y = ((viewport.clientHeight || 600) - h * view.scale) / 2;
    apply();
  }

  function readable() {
    // the drawing at its natural size or smaller to fit, but never so small that labels drop below MIN_TEXT_PX
    const { w, h } = size();
    const width = viewport.clientWidth || 800;
    const height = viewport.clientHeight || 600;
    view.scale = Math.max(Math.min(width / w, height / h, 1), MIN_TEXT_PX / FONT_PX);
    view.x = w * view.scale <= width ? (width - w * view.scale) / 2 : 0;
    view.y = h * view.scale <= height ? (height - h * view.scale) / 2 : 0;
    apply();
  }

  function zoomAt(factor, cx, cy) {
    const scale = Math.min(4, Math.max(0.05, view.scale * factor));
    const x = cx === undefined ? (viewport.clientWidth || 800) / 2 : cx;
    const y = cy === undefined ? (viewport.clientHeight || 600) / 2 : cy;
    view.x = x - (x - view.x) * (scale / view.scale);
    view.y = y - (y - view.y) * (scale / view.scale);
    view.scale = scale;
    apply();
  }

  function clampView() {
    // after an automatic move: a drawing larger than the view fills it (no empty band beside its edge while more
    // of it is hidden on the other side); a smaller one is centred
    const { w, h } = size();
    const width = viewport.clientWidth || 800;
    const height = viewport.clientHeight || 600;
    const [dw, dh] = [w * view.scale, h * view.scale];
    view.x = dw <= width ? (width - dw) / 2 : Math.min(0, Math.max(width - dw, view.x));
    view.y = dh <= height ? (height - dh) / 2 : Math.min(0, Math.max(height - dh, view.y));
  }

  function bringIntoView(ids, margin) {
    // the boxes of `ids` (the first one first) in view at a readable zoom: centred when they are not, then clamped
    const targets = ids.filter((id) => id).map((id) => canvas.querySelector("#" + (hiddenIn[id] || id))).filter((t) => t);
    if (!targets.length) { return; }
    if (view.scale * FONT_PX < MIN_TEXT_PX) { view.scale = MIN_TEXT_PX / FONT_PX; apply(); }
    const port = viewport.getBoundingClientRect();
    const boxes = targets.map((t) => t.getBoundingClientRect());
    let box = { left: Math.min(...boxes.map((b) => b.left)), right: Math.max(...boxes.map((b) => b.right)),
      top: Math.min(...boxes.map((b) => b.top)), bottom: Math.max(...boxes.map((b) => b.bottom)) };
    if (box.right - box.left > port.width - 2 * margin || box.bottom - box.top > port.height - 2 * margin) {
      box = boxes[0]; // together they do not fit: the first
    }
    if (box.left >= port.left + margin && box.right <= port.right - margin &&
        box.top >= port.top + margin && box.bottom <= port.bottom - margin) { return; }
    view.x += port.left + port.width / 2 - (box.left + box.right) / 2;
    view.y += port.top + port.height / 2 - (box.top + box.bottom) / 2;
    clampView();
    apply();
  }

  function followCurrent() {
    // the current node; before the first step, the root with the first node to run beside it
    const steps = passes[pass].steps;
    const node = steps[step].node;
    if (!follow.checked) { return; }
    if (node) { bringIntoView([node], 40); return; }
    if (step === 0) { bringIntoView([(passes[pass].roots || [])[0], steps.length > 1 ? steps[1].node : null], 20); }
  }

  function centreOn(id) {
    bringIntoView([id], 0);
  }

  function showEdges(ids) {
    // a chosen path's arrows in view: module groups holding them opened, the view moved (and zoomed out as far as
    // needed, down to a tenth) so that all of them show, unless they all show already
    const groups = passes[pass].groups;
    if (groups) {
      const shut = groups.list.filter((g) => g.edgeSet && ids.some((e) => g.edgeSet.has(e)) &&
        canvas.querySelector("#" + g.id + ".al-collapsed"));
      shut.forEach((g) => { opened[g.id] = true; });
      if (shut.length) { applyGroups(); }
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
      view.scale = Math.max(view.scale * room, 0.1);
      apply();
      box = union();
    }
    view.x += port.left + port.width / 2 - (box.left + box.right) / 2;
    view.y += port.top + port.height / 2 - (box.top + box.bottom) / 2;
    apply();
  }

  // what feeds the selected node (upstream) and what it feeds (downstream), along the drawing's arrows
  function related(node) {
    const into = {};
    const out = {};
    (passes[pass].links || []).forEach(([a, b, e]) => {
      (into[b] = into[b] || []).push([a, e]);
      (out[a] = out[a] || []).push([b, e]);
    });
    const reach = (next) => {
      const seen = {};
      const edges = {};
      const todo = [node];
      while (todo.length) {
        (next[todo.pop()] || []).forEach(([m, e]) => {
          edges[e] = 1;
          if (!seen[m]) { seen[m] = 1; todo.push(m); }
        });
      }
      return [keys(seen), keys(edges)];
    };
    const [up, upEdges] = reach(into);
    const [down, downEdges] = reach(out);
    return { up, down, edges: upEdges.concat(downEdges) };
  }

  function select(node) {
    root.setAttribute("data-selected", node || "");
    if (!node) {
      selectStyle.textContent = "";
      root.removeAttribute("data-upstream");
      root.removeAttribute("data-downstream");
      if (passes[pass].notes) { cardBox.textContent = ""; }
      return;
    }
    const near = related(node);
    const kept = [node].concat(near.up, near.down, near.edges).map((id) => scope + " #" + id);
    const shape = (id) => ["polygon", "path", "ellipse"].map((s) => scope + " #" + id + " > " + s).join(", ");
    selectStyle.textContent = [scope + " .al-canvas g.node, " + scope + " .al-canvas g.edge {opacity: 0.2}",
      kept.join(", ") + " {opacity: 1}", shape(node) + " {stroke: #db2777; stroke-width: 4px}"].join("\n");
    const notes = passes[pass].notes;
    if (notes) { cardBox.textContent = notes[node] || ""; } // a folded box: how to draw it in full
    root.setAttribute("data-upstream", String(near.up.length));
    root.setAttribute("data-downstream", String(near.down.length));
  }

  let found = [];
  let foundAt = -1;
  function find(query) {
    const q = query.trim().toLowerCase();
    canvas.querySelectorAll(".al-found").forEach((g) => { g.classList.remove("al-found"); });
    found = !q ? [] : Array.from(canvas.querySelectorAll("g.node, g.cluster"))
      .filter((g) => g.id && (g.textContent || "").toLowerCase().includes(q)).map((g) => g.id);
    found.forEach((id) => { canvas.querySelector("#" + id).classList.add("al-found"); });
    foundAt = -1;
    root.setAttribute("data-found", String(found.length));
  }

  function reveal(id) {
    // a node inside a collapsed module group: open the groups around it first
    const groups = passes[pass].groups;
    if (groups && hiddenIn[id]) {
      groups.list.forEach((g) => { if (g.nodeSet && g.nodeSet.has(id)) { opened[g.id] = true; } });
      applyGroups();
    }
    const target = canvas.querySelector("#" + id);
    if (target && target.classList.contains("node")) { select(id); }
    centreOn(id);
  }

  // folded boxes of graph() ("layers.0-11 (x12)"): a click, Enter or Space opens one, showing a drawing laid out in
  // advance with its blocks in full (passes[p].folds.states); the outline of an opened block folds its run again
  let foldState = 0;
  const foldSvgs = {};
  function foldsOf(p) { return passes[p].folds || null; }

  function markFolds() {
    const folds = foldsOf(pass);
    root.removeAttribute("data-fold-state");
    if (!folds) { return; }
    const state = folds.states[foldState];
    root.setAttribute("data-fold-state", String(foldState));
    const mark = (id, expanded, hint) => {
      const g = canvas.querySelector("#" + id);
      if (!g) { return; }
      const label = state.labels[id] + hint;
      g.classList.add("al-foldable");
      g.setAttribute("tabindex", "0");
      g.setAttribute("role", "button");
      g.setAttribute("aria-expanded", expanded ? "true" : "false");
      g.setAttribute("aria-label", label);
      const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = label;
      g.prepend(title);
    };
    keys(state.open).forEach((id) => { mark(id, false, state.open[id][0] >= 0 ? " (click, Enter or Space: open)" : ""); });
    keys(state.close).forEach((id) => { mark(id, true, state.close[id][0] >= 0 ? "" : " (not stored in this page)"); });
  }

  function showFoldState(p, target) {
    const folds = foldsOf(p);
    foldState = target;
    const state = folds.states[target];
    if (target === 0) {
      canvas.innerHTML = svgOf(p);
    } else {
      if (!(target in foldSvgs)) { foldSvgs[target] = decodeSvg(state.svg); }
      canvas.innerHTML = foldSvgs[target];
    }
    passes[p].links = state.links;
    passes[p].roots = state.roots;
    passes[p].notes = state.notes;
    markFolds();
  }

  function resetFolds(p) { // the pass's own drawing was just put in the canvas: the folded state
    foldState = 0;
    const folds = foldsOf(p);
    if (folds) { ["links", "roots", "notes"].forEach((name) => { passes[p][name] = folds.states[0][name]; }); }
    markFolds();
  }

  function topInView(target) { // an opened block's outline is often taller than the view: its name (top) in view
    if (view.scale * FONT_PX < MIN_TEXT_PX) { view.scale = MIN_TEXT_PX / FONT_PX; apply(); }
    const box = target.getBoundingClientRect();
    const port = viewport.getBoundingClientRect();
    view.x += port.left + port.width / 2 - (box.left + Math.min(box.width, port.width - 40) / 2);
    view.y += port.top + (box.height > port.height - 40 ? 20 : port.height / 2 - box.height / 2) - box.top;
    apply();
  }

  // true when `id` is a folded box or an opened block's outline (then it is opened or folded here)
  function foldAction(id, fromKey) {
    const folds = foldsOf(pass);
    if (!folds || !id) { return false; }
    const state = folds.states[foldState];
    const move = state.open[id] || state.close[id];
    if (!move) { return false; }
    if (move[0] < 0) { // not stored in this page: say how to draw it
      select(null);
      cardBox.textContent = state.notes[id] || state.labels[id] + ": not stored in this page; draw it with expand=.";
      return true;
    }
    const scale = view.scale;
    showFoldState(pass, move[0]);
    select(null);
    find(search.value);
    const { w, h } = size(); // as tall as the new drawing needs (as choosePass sizes it), within limits
    const fitted = Math.max(Math.min((viewport.clientWidth || 800) / w, 1), MIN_TEXT_PX / FONT_PX);
    viewport.style.height = Math.round(Math.max(160, Math.min(h * fitted + 8, 620))) + "px";
    view.scale = scale;
    apply();
    const target = canvas.querySelector("#" + move[1]);
    if (target) {
      topInView(target);
      if (fromKey && target.focus) { target.focus({ preventScroll: true }); }
    }
    cardBox.textContent = id in state.open ? "Opened " + move[2] + ": its blocks drawn in full. Click a block's outline " +
      "or name (or Enter / Space on it) to fold them again." : "Folded " + move[2] + " again.";
    return true;
  }

  baseStyle.textContent += "\n" + [scope + " .al-foldable {cursor: pointer}",
    scope + " .al-foldable:focus {outline: none}",
    scope + " .al-foldable:focus > polygon, " + scope + " .al-foldable:focus > path, " + scope +
    " .al-foldable:focus > ellipse {stroke: #2563eb; stroke-width: 4px}"].join("\n");
  function markGroupKeys() { // module groups (%%lens --modules) open and close from the keyboard too
    const groups = passes[pass].groups;
    if (!groups) { return; }
    groups.list.forEach((g) => {
      const cluster = canvas.querySelector("#" + g.id);
      if (!cluster) { return; }
      const shut = cluster.classList.contains("al-collapsed");
      cluster.setAttribute("tabindex", "0");
      cluster.setAttribute("role", "button");
      cluster.setAttribute("aria-expanded", shut ? "false" : "true");
      cluster.setAttribute("aria-label", g.label + ": " + g.nodes.length + " boxes, " + (shut ? "closed" : "open") +
        " (Enter or Space: " + (shut ? "open" : "close") + ")");
    });
  }

  // Enter or Space on a folded box, an opened outline or a module group (the window's capture phase: before the
  // notebook's own keys)
  const onFoldKey = (event) => {
    if (!root.isConnected) { window.removeEventListener("keydown", onFoldKey, true); return; }
    if (event.key !== "Enter" && event.key !== " ") { return; }
    const target = event.target && event.target.closest ? event.target : null;
    const g = target ? target.closest(".al-foldable") : null;
    const cluster = target && !g ? target.closest("g.cluster") : null;
    if (g && canvas.contains(g)) {
      event.preventDefault();
      event.stopPropagation();
      foldAction(g.id, true);
    } else if (cluster && canvas.contains(cluster) && passes[pass].groups && cluster.id) {
      event.preventDefault();
      event.stopPropagation();
      opened[cluster.id] = cluster.classList.contains("al-collapsed");
      applyGroups();
    }
  };
  window.addEventListener("keydown", onFoldKey, true);

  function setupGroups(p) {
    opened = {};
    hiddenIn = {};
    const groups = passes[p].groups;
    groupSelect.style.display = groups ? "" : "none";
    groupStyle.textContent = "";
    if (!groups) { return; }
    const svgNs = "http://www.w3.org/2000/svg";
    groups.list.forEach((g) => {
      g.nodeSet = new Set(g.nodes);
      g.edgeSet = new Set(g.edges.concat(g.border || []));
      g.besideSet = new Set(g.beside || []);
      const cluster = canvas.querySelector("#" + g.id);
      if (!cluster) { return; }
      const small = cluster.querySelector(":scope > text");
      if (small) { small.classList.add("al-small"); }
      const title = document.createElementNS(svgNs, "title");
      title.textContent = g.label + ": " + g.nodes.length + " boxes (click the outline or the name to open or close)";
      cluster.prepend(title);
      // the name, as large as the box allows, shown when the group is collapsed
      const shape = cluster.querySelector(":scope > path, :scope > polygon");
      const numbers = ((shape && (shape.getAttribute("d") || shape.getAttribute("points"))) || "").match(/-?\d+(?:\.\d+)?/g) || [];
      if (numbers.length < 4) { return; }
      const xs = numbers.filter((_, i) => i % 2 === 0).map(parseFloat);
      const ys = numbers.filter((_, i) => i % 2 === 1).map(parseFloat);
      const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
      const lines = g.label.split(" · ");
      const longest = Math.max(...lines.map((line) => line.length));
      const fontSize = Math.max(4, Math.min(24, (y1 - y0) * 0.45 / lines.length, (x1 - x0) * 0.9 / (0.6 * longest)));
      const name = document.createElementNS(svgNs, "text");
      name.setAttribute("class", "al-group-name");
      name.setAttribute("text-anchor", "middle");
      name.setAttribute("font-size", fontSize.toFixed(1));
      lines.forEach((line, i) => {
        const span = document.createElementNS(svgNs, "tspan");
        span.setAttribute("x", ((x0 + x1) / 2).toFixed(1));
        span.setAttribute("y", (y0 + fontSize * (i + 1.1)).toFixed(1)); // at the top: arrows' labels cross the middle
        span.textContent = line;
        name.appendChild(span);
      });
      cluster.appendChild(name);
    });
  }

  function isOpen(g, current, total, near) {
    if (g.id in opened) { return opened[g.id]; }
    if (groupMode !== "auto") { return groupMode === "open"; }
    // auto: small drawings stay open; a big one shows the groups around the current step, and any group
    // holding most of the drawing (the model itself)
    return !passes[pass].groups.collapse || (!!current && (g.nodeSet.has(current) || g.besideSet.has(current))) ||
      g.nodes.length * 2 > total || near.some((e) => g.edgeSet.has(e));
  }

  function applyGroups() {
    const groups = passes[pass].groups;
    if (!groups) { return; }
    const current = passes[pass].steps[step].node;
    const list = groups.list;
    // around the current step: the group of its node, the groups beside it (a parameter's layer), and the
    // groups its arrows reach (where the gradient goes)
    const near = passes[pass].steps[step].edges;
    const shut = list.map((g) => !isOpen(g, current, groups.total, near));
    const hiders = list.map(() => null); // the outermost collapsed group around each group (itself included)
    hiddenIn = {};
    const rules = [];
    list.forEach((g, i) => {
      const outer = g.parent !== null && g.parent !== undefined ? hiders[g.parent] : null;
      hiders[i] = outer !== null ? outer : (shut[i] ? i : null);
      const cluster = canvas.querySelector("#" + g.id);
      if (cluster) { cluster.classList.toggle("al-collapsed", shut[i] && outer === null); }
      if (outer !== null) {
        rules.push(scope + " #" + g.id);
      } else if (shut[i]) {
        g.nodes.forEach((n) => { hiddenIn[n] = g.id; rules.push(scope + " #" + n); });
        g.edges.forEach((e) => { rules.push(scope + " #" + e); });
      }
    });
    groupStyle.textContent = rules.length ? rules.join(", ") + " {display: none}" : "";
    root.setAttribute("data-collapsed", list.filter((g, i) => hiders[i] === i).map((g) => g.id).join(" "));
    markGroupKeys();
  }

  function question(k) {
    const q = passes[pass].questions;
    return predict && q ? q[k] : null;
  }

  function show(k, fromModel) {
    const steps = passes[pass].steps;
    step = Math.max(0, Math.min(k, steps.length - 1));
    const ask = question(step);
    const settled = answered[pass + ":" + step];
    frameStyle.textContent = frameCss(scope, steps, step, !!(ask && !settled));
    if (ask && !settled) {
      const tried = tries[pass + ":" + step];
      cardBox.innerHTML = (tried ? '<div class="al-feedback al-wrong al-tryagain">' +
        escapeText(tryAgainText(tried[1], ask[1], tried[0])) + "</div>" : "") + ask[0];
      const boxes = Array.from(cardBox.querySelectorAll("input.al-answer"));
      if (tried) { boxes.forEach((box, i) => { box.value = tried[1][i] || ""; }); }
      if (boxes.length && (tried || root.contains(document.activeElement))) { boxes[0].focus(); }
    } else {
      const why = settled && ask && ask[2] ? '<div class="al-why">Why: ' + escapeText(ask[2]) + "</div>" : "";
      cardBox.innerHTML = (settled ? '<div class="al-feedback ' + (settled[0] ? "al-right" : "al-wrong") + '">' +
        escapeText(settled[1]) + "</div>" + why : "") + passes[pass].cards[step];
    }
    // in predict mode the with/without table would give the answers away: it shows at the last step, once
    // that step's question (if any) is answered
    tableBox.style.display = predict && (step < steps.length - 1 || (ask && !settled)) ? "none" : "";
    slider.max = String(steps.length - 1);
    slider.value = String(step);
    position.textContent = "step " + step + " of " + (steps.length - 1);
    root.setAttribute("data-step", String(step));
    applyGroups();
    followCurrent();
    if (!fromModel && model.get("step") !== step) {
      model.set("step", step);
      model.save_changes();
    }
  }

  function choosePass(p, fromModel) {
    pass = p;
    canvas.innerHTML = svgOf(p);
    for (const [id, text] of Object.entries(passes[p].sources || {})) {
      const group = canvas.querySelector("#" + id);
      if (group) { // hover over a backward function: the cell line that made it
        const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
        title.textContent = text;
        group.prepend(title);
      }
    }
    markTitles(canvas, passes[p].marktitles);
    pathsUi.setup(passes[p].paths);
    setupGroups(p);
    resetFolds(p);
    select(null);
    find(search.value);
    tableBox.innerHTML = passes[p].table;
    if (passSelect) { passSelect.value = String(p); }
    stop();
    const { w, h } = size();
    // as tall as the drawing needs at the zoom that fits its width (labels kept readable), within limits
    const scale = Math.max(Math.min((viewport.clientWidth || 800) / w, 1), MIN_TEXT_PX / FONT_PX);
    viewport.style.height = Math.round(Math.max(160, Math.min(h * scale + 8, 620))) + "px";
    readable();
    // the root (the loss) in view from the start, with the first node to run beside it
    bringIntoView([(passes[p].roots || [])[0], passes[p].steps.length > 1 ? passes[p].steps[1].node : null], 20);
    if (!fromModel && model.get("pass_index") !== p) {
      model.set("pass_index", p);
      model.save_changes();
    }
    show(fromModel ? model.get("step") || 0 : 0, fromModel);
    return w + h;
  }

  function stop() {
    if (timer) { clearInterval(timer); timer = null; }
    playButton.textContent = "play";
    playButton.setAttribute("aria-pressed", "false");
  }

  function play() {
    if (timer) { stop(); return; }
    if (step >= passes[pass].steps.length - 1) { show(0); }
    playButton.textContent = "pause";
    playButton.setAttribute("aria-pressed", "true");
    timer = setInterval(() => {
      if (step >= passes[pass].steps.length - 1) { stop(); return; }
      show(step + 1);
      if (question(step) && !answered[pass + ":" + step]) { stop(); } // wait for the student's answer
    }, 900);
  }

  function settle(reveal) {
    const ask = question(step);
    if (!ask) { return; }
    const texts = Array.from(cardBox.querySelectorAll("input.al-answer")).map((box) => box.value);
    const key = pass + ":" + step;
    const verdict = reveal ? [false, revealText(ask[1])] : checkAnswers(texts, ask[1]);
    if (!reveal && !verdict[0]) { // not yet: the question stays open for another try
      tries[key] = [(tries[key] ? tries[key][0] : 0) + 1, texts];
      show(step);
      return;
    }
    if (!reveal && tries[key]) { verdict[1] += " (try " + (tries[key][0] + 1) + ")"; }
    delete tries[key];
    answered[key] = verdict;
    model.set("answers", Object.assign({}, answered));
    model.save_changes();
    show(step);
  }

  const go = {
    first: () => show(0),
    prev: () => show(step - 1),
    next: () => show(step + 1),
    last: () => show(passes[pass].steps.length - 1),
    "zoom-in": () => zoomAt(1.25),
    "zoom-out": () => zoomAt(0.8),
    fit: () => fit(),
    root: () => (passes[pass].roots || []).slice(0, 1).forEach(centreOn),
  };
  toolbar.addEventListener("click", (event) => {
    const action = event.target.getAttribute && event.target.getAttribute("data-go");
    if (!action) { return; }
    if (action === "play") { play(); return; }
    if (action.startsWith("zoom") || action === "fit" || action === "root") { go[action](); return; }
    stop();
    go[action]();
  });
  cardBox.addEventListener("click", (event) => {
    const action = event.target.getAttribute && event.target.getAttribute("data-go");
    if (action === "check" || action === "reveal") { settle(action === "reveal"); }
  });
  cardBox.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.target.classList && event.target.classList.contains("al-answer")) {
      event.preventDefault();
      settle(false);
    }
  });
  slider.addEventListener("input", () => { stop(); show(parseInt(slider.value, 10)); });
  search.addEventListener("input", () => { find(search.value); });
  search.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && found.length) {
      event.preventDefault();
      foundAt = (foundAt + 1) % found.length;
      reveal(found[foundAt]);
    } else if (event.key === "Escape") {
      search.value = "";
      find("");
      select(null);
    }
  });
  groupSelect.addEventListener("change", () => { groupMode = groupSelect.value; opened = {}; applyGroups(); followCurrent(); });
  if (passSelect) { passSelect.addEventListener("change", () => choosePass(parseInt(passSelect.value, 10))); }
  const onKey = (event) => {
    if (event.target && (event.target.tagName === "INPUT" || event.target.tagName === "SELECT")) { return; }
    if (event.ctrlKey || event.metaKey || event.altKey) { return; }
    const actions = { ArrowRight: "next", ArrowLeft: "prev", j: "next", k: "prev", Home: "first", End: "last", "+": "zoom-in", "=": "zoom-in", "-": "zoom-out", "0": "fit", r: "root", Escape: "unselect" };
    const action = actions[event.key];
    if (!action) { return; }
    event.preventDefault();
    // the notebook's own shortcuts (j/k select cells, arrows move between them) must not also run
    event.stopPropagation();
    if (action === "unselect") { select(null); return; }
    if (!action.startsWith("zoom") && action !== "fit" && action !== "root") { stop(); }
    go[action]();
  };
  root.addEventListener("keydown", onKey);
  // Notebook 7 takes the arrow keys before they reach the output (in its capture phase): the window's capture
  // phase comes first, so keys pressed inside this stepper are handled there
  const onWindowKey = (event) => { if (root.contains(event.target)) { onKey(event); } };
  window.addEventListener("keydown", onWindowKey, true);
  viewport.addEventListener("wheel", (event) => {
    if (!event.ctrlKey && !event.metaKey) { return; } // plain wheel scrolls the notebook
    event.preventDefault();
    const port = viewport.getBoundingClientRect();
    zoomAt(event.deltaY < 0 ? 1.15 : 1 / 1.15, event.clientX - port.left, event.clientY - port.top);
  }, { passive: false });
  let drag = null;
  viewport.addEventListener("pointerdown", (event) => {
    drag = { x: event.clientX, y: event.clientY, vx: view.x, vy: view.y, target: event.target };
    viewport.setPointerCapture(event.pointerId);
    viewport.classList.add("al-dragging");
  });
  viewport.addEventListener("pointermove", (event) => {
    if (!drag) { return; }
    view.x = drag.vx + event.clientX - drag.x;
    view.y = drag.vy + event.clientY - drag.y;
    apply();
  });
  const endDrag = () => { drag = null; viewport.classList.remove("al-dragging"); };
  viewport.addEventListener("pointerup", (event) => {
    // a click (no drag) on a module group's outline or name opens or closes it
    const cluster = drag && Math.abs(event.clientX - drag.x) + Math.abs(event.clientY - drag.y) < 4 &&
      drag.target && drag.target.closest ? drag.target.closest("g.cluster") : null;
    const node = drag && !cluster && Math.abs(event.clientX - drag.x) + Math.abs(event.clientY - drag.y) < 4 &&
      drag.target && drag.target.closest ? drag.target.closest("g.node") : null;
    endDrag();
    if (node && node.id && !foldAction(node.id)) { select(root.getAttribute("data-selected") === node.id ? null : node.id); }
    if (cluster && cluster.id && foldAction(cluster.id)) { return; }
    if (cluster && passes[pass].groups && cluster.id) {
      opened[cluster.id] = cluster.classList.contains("al-collapsed");
      applyGroups();
    }
  });
  viewport.addEventListener("pointercancel", endDrag);

  const onStep = () => { if (model.get("step") !== step) { show(model.get("step"), true); } };
  const onPass = () => { if (model.get("pass_index") !== pass) { choosePass(model.get("pass_index"), true); } };
  model.on("change:step", onStep);
  model.on("change:pass_index", onPass);
  root.alFrameCss = (p, k) => frameCss(scope, passes[p].steps, k, false);
  root.alPaths = (choice) => pathsUi.choose(choice);
  root.alAnswer = (text) => {
    const texts = Array.isArray(text) ? text : [text];
    cardBox.querySelectorAll("input.al-answer").forEach((box, i) => { box.value = texts[i] === undefined ? "" : texts[i]; });
    settle(false);
  };
  choosePass(pass, true);
  return () => {
    stop();
    window.removeEventListener("keydown", onWindowKey, true);
    model.off("change:step", onStep);
    model.off("change:pass_index", onPass);
  };
}

export default { render };
