// The stepper's constants and pure parts (part of stepper.js's module, joined by static_html.module_source): the
// CSS of a step (frameCss), checking a prediction, the paths highlight and its menu, small DOM helpers.

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

// Mirrors autograd_lens.views.questions.answer_numbers: a fraction such as 1/4 is one number, U+2212 a minus.
export function answerNumbers(text) {
  const number = "[-+]?(?:\\d+\\.?\\d*|\\.\\d+)(?:[eE][-+]?\\d+)?";
  const pattern = new RegExp(number + "(?:\\s*/\\s*" + number + ")?", "g");
  const tokens = String(text).replace(/\u2212/g, "-").match(pattern) || [];
  return tokens.map((token) => {
    const [top, bottom] = token.split("/");
    return bottom === undefined ? parseFloat(top) : parseFloat(top) / parseFloat(bottom);
  });
}

// Mirrors autograd_lens.views.steps.check_answer: same parsing, tolerance and words.
export function checkAnswer(text, answer, shown) {
  let numbers = answerNumbers(text);
  if (!numbers.length) { return [false, "Type a number (or a list such as [1, 2]); autograd computed " + shown + "."]; }
  if (numbers.length === 1 && answer.length > 1) { numbers = answer.map(() => numbers[0]); }
  if (numbers.length !== answer.length) {
    return [false, "Not quite: that is " + numbers.length + " number" + (numbers.length !== 1 ? "s" : "") +
      ", the gradient has " + answer.length + ". Autograd computed " + shown + "."];
  }
  const floor = 1e-6 * Math.max(Math.max(...answer.map(Math.abs)), 1e-3);  // each entry at its printed precision
  const close = numbers.every((a, i) => Math.abs(a - answer[i]) <= floor + 1e-3 * Math.abs(answer[i]));
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
    const count = answerNumbers(text).length;
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
    const entry = choice && paths ? paths[parseInt(choice.split(".")[0], 10)] : null;
    note.textContent = chosen.map((p) => p.text + (p.edges.length || p.rest ? "" : " (not on the drawing)"))
      .concat(chosen.length && entry && entry.hooks ? [entry.hooks] : []).join("\n");
    note.style.display = chosen.length ? "" : "none";
    root.setAttribute("data-paths", choice);
    if (chosen.length && shown) { shown([].concat(...chosen.map((p) => p.edges))); }
  };
  select.addEventListener("change", () => choose(select.value));
  const setup = (passPaths) => {
    paths = passPaths || null;
    select.replaceChildren(make("option", { value: "" }, "paths: off"));
    (paths || []).forEach((entry, i) => {
      const group = make("optgroup", { label: "paths to " + entry.name + " (" + entry.count + ")" +
        (entry.hooks ? ", without hooks" : "") });
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
