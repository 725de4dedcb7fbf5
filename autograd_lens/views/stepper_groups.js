// The stepper's module groups (%%lens --modules; part of stepper.js's module): which groups are collapsed around
// the current step, their names and keys, and Enter or Space on a group or a folded box.

function groupParts(s) {
  const { passes, scope, root, canvas, groupSelect, groupStyle } = s;
  function markGroupKeys() { // module groups (%%lens --modules) open and close from the keyboard too
    const groups = passes[s.pass].groups;
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
      s.foldAction(g.id, true);
    } else if (cluster && canvas.contains(cluster) && passes[s.pass].groups && cluster.id) {
      event.preventDefault();
      event.stopPropagation();
      s.opened[cluster.id] = cluster.classList.contains("al-collapsed");
      applyGroups();
    }
  };
  window.addEventListener("keydown", onFoldKey, true);

  function setupGroups(p) {
    s.opened = {};
    s.hiddenIn = {};
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
    if (g.id in s.opened) { return s.opened[g.id]; }
    if (s.groupMode !== "auto") { return s.groupMode === "open"; }
    // auto: small drawings stay open; a big one shows the groups around the current step, and any group
    // holding most of the drawing (the model itself)
    return !passes[s.pass].groups.collapse || (!!current && (g.nodeSet.has(current) || g.besideSet.has(current))) ||
      g.nodes.length * 2 > total || near.some((e) => g.edgeSet.has(e));
  }

  function applyGroups() {
    const groups = passes[s.pass].groups;
    if (!groups) { return; }
    const current = passes[s.pass].steps[s.step].node;
    const list = groups.list;
    // around the current step: the group of its node, the groups beside it (a parameter's layer), and the
    // groups its arrows reach (where the gradient goes)
    const near = passes[s.pass].steps[s.step].edges;
    const shut = list.map((g) => !isOpen(g, current, groups.total, near));
    const hiders = list.map(() => null); // the outermost collapsed group around each group (itself included)
    s.hiddenIn = {};
    const rules = [];
    list.forEach((g, i) => {
      const outer = g.parent !== null && g.parent !== undefined ? hiders[g.parent] : null;
      hiders[i] = outer !== null ? outer : (shut[i] ? i : null);
      const cluster = canvas.querySelector("#" + g.id);
      if (cluster) { cluster.classList.toggle("al-collapsed", shut[i] && outer === null); }
      if (outer !== null) {
        rules.push(scope + " #" + g.id);
      } else if (shut[i]) {
        g.nodes.forEach((n) => { s.hiddenIn[n] = g.id; rules.push(scope + " #" + n); });
        g.edges.forEach((e) => { rules.push(scope + " #" + e); });
      }
    });
    groupStyle.textContent = rules.length ? rules.join(", ") + " {display: none}" : "";
    root.setAttribute("data-collapsed", list.filter((g, i) => hiders[i] === i).map((g) => g.id).join(" "));
    markGroupKeys();
  }

  return { applyGroups, markGroupKeys, setupGroups };
}
