// The stepper's selection, search and folded boxes (part of stepper.js's module): what is upstream and downstream
// of a selected node, the find box's matches, and opening or folding graph()'s folded blocks.

function findParts(s) {
  const { passes, scope, root, canvas, viewport, cardBox, search, selectStyle } = s;
  // what feeds the selected node (upstream) and what it feeds (downstream), along the drawing's arrows
  function related(node) {
    const into = {};
    const out = {};
    (passes[s.pass].links || []).forEach(([a, b, e]) => {
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
      if (passes[s.pass].notes) { cardBox.textContent = ""; }
      return;
    }
    const near = related(node);
    const kept = [node].concat(near.up, near.down, near.edges).map((id) => scope + " #" + id);
    const shape = (id) => ["polygon", "path", "ellipse"].map((s) => scope + " #" + id + " > " + s).join(", ");
    selectStyle.textContent = [scope + " .al-canvas g.node, " + scope + " .al-canvas g.edge {opacity: 0.2}",
      kept.join(", ") + " {opacity: 1}", shape(node) + " {stroke: #db2777; stroke-width: 4px}"].join("\n");
    const notes = passes[s.pass].notes;
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

  function findNext() { // Enter in the find box: the next match, selected and in view
    if (!found.length) { return false; }
    foundAt = (foundAt + 1) % found.length;
    reveal(found[foundAt]);
    return true;
  }

  function reveal(id) {
    // a node inside a collapsed module group: open the groups around it first
    const groups = passes[s.pass].groups;
    if (groups && s.hiddenIn[id]) {
      groups.list.forEach((g) => { if (g.nodeSet && g.nodeSet.has(id)) { s.opened[g.id] = true; } });
      s.applyGroups();
    }
    const target = canvas.querySelector("#" + id);
    if (target && target.classList.contains("node")) { select(id); }
    s.centreOn(id);
  }

  // folded boxes of graph() ("layers.0-11 (x12)"): a click, Enter or Space opens one, showing a drawing laid out in
  // advance with its blocks in full (passes[p].folds.states); the outline of an opened block folds its run again
  let foldState = 0;
  const foldSvgs = {};
  function foldsOf(p) { return passes[p].folds || null; }

  function markFolds() {
    const folds = foldsOf(s.pass);
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
      canvas.innerHTML = s.svgOf(p);
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

  // true when `id` is a folded box or an opened block's outline (then it is opened or folded here)
  function foldAction(id, fromKey) {
    const folds = foldsOf(s.pass);
    if (!folds || !id) { return false; }
    const state = folds.states[foldState];
    const move = state.open[id] || state.close[id];
    if (!move) { return false; }
    if (move[0] < 0) { // not stored in this page: say how to draw it
      select(null);
      cardBox.textContent = state.notes[id] || state.labels[id] + ": not stored in this page; draw it with expand=.";
      return true;
    }
    const scale = s.view.scale;
    showFoldState(s.pass, move[0]);
    select(null);
    find(search.value);
    const { w, h } = s.size(); // as tall as the new drawing needs (as choosePass sizes it), within limits
    const fitted = Math.max(Math.min((viewport.clientWidth || 800) / w, 1), MIN_TEXT_PX / FONT_PX);
    viewport.style.height = Math.round(Math.max(160, Math.min(h * fitted + 8, 620))) + "px";
    s.view.scale = scale;
    s.apply();
    const target = canvas.querySelector("#" + move[1]);
    if (target) {
      s.topInView(target);
      if (fromKey && target.focus) { target.focus({ preventScroll: true }); }
    }
    cardBox.textContent = id in state.open ? "Opened " + move[2] + ". Click an opened block's outline or name (or " +
      "Enter / Space on it) to fold it again." : "Folded " + move[2] + " again.";
    return true;
  }

  return { find, findNext, foldAction, resetFolds, reveal, select };
}
