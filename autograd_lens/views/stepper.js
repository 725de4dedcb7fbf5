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
//
// The module is kept in five files, joined in this order by static_html.module_source (one script for the page and
// the widget): stepper_base.js (constants, frameCss, predictions, paths), stepper_view.js (zoom, pan, what is in
// view), stepper_find.js (selection, search, folded boxes), stepper_groups.js (module groups), then this file:
// render(), which builds the controls and wires them to those parts.

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
  baseStyle.textContent += "\n" + [scope + " .al-foldable {cursor: pointer}",
    scope + " .al-foldable:focus {outline: none}",
    scope + " .al-foldable:focus > polygon, " + scope + " .al-foldable:focus > path, " + scope +
    " .al-foldable:focus > ellipse {stroke: #2563eb; stroke-width: 4px}"].join("\n");
  root.append(baseStyle, frameStyle, groupStyle, selectStyle, pathsUi.style, toolbar, pathsUi.note, viewport, cardBox, tableBox);
  el.replaceChildren(root);

  let pass = Math.min(model.get("pass_index") || 0, passes.length - 1);
  let step = 0;
  let timer = null;
  let view = { scale: 1, x: 0, y: 0 };
  let groupMode = "auto";
  let opened = {}; // group id -> true (opened) / false (closed) by a click, for this pass
  let hiddenIn = {}; // node id -> the id of the outermost collapsed group hiding it
  const answered = Object.assign({}, model.get("answers") || {});
  const tries = {}; // "pass:step" -> [wrong tries so far, the last answer's texts], while its question is open
  // what the parts (stepper_view.js, stepper_find.js, stepper_groups.js) share: the elements, and this state through
  // accessors
  const s = { passes, predict, scope, root, canvas, viewport, cardBox, search, follow, groupSelect, groupStyle, selectStyle,
    get pass() { return pass; }, get step() { return step; }, get view() { return view; },
    get groupMode() { return groupMode; }, get opened() { return opened; }, set opened(value) { opened = value; },
    get hiddenIn() { return hiddenIn; }, set hiddenIn(value) { hiddenIn = value; } };
  Object.assign(s, viewParts(s), findParts(s), groupParts(s));
  const { svgOf, size, apply, fit, readable, zoomAt, bringIntoView, followCurrent, centreOn, showEdges, select, find,
    findNext, foldAction, resetFolds, setupGroups, applyGroups } = s;

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
    if (event.key === "Enter" && findNext()) {
      event.preventDefault();
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
