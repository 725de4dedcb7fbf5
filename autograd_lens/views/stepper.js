// autograd_lens static stepper: steps a pre-rendered backward pass with no kernel and no network.
// The data (steps, cards) is a JSON script next to this one; frameCss mirrors
// autograd_lens.views.passview.frame_css, so a step looks the same here and in the live widget.
(function (root) {
  "use strict";
  if (!root || root.getAttribute("data-ready")) { return; }
  root.setAttribute("data-ready", "1");
  var CURRENT = "#2563eb", DONE = "#16a34a";
  var data = JSON.parse(root.querySelector("script.al-data").textContent);
  var scope = "#" + root.id;
  var frameStyle = root.querySelector("style.al-frame");
  var slider = root.querySelector("input.al-slider");
  var position = root.querySelector(".al-pos");
  var cardBox = root.querySelector(".al-cardbox");
  var tableBox = root.querySelector(".al-tablebox");
  var passSelect = root.querySelector("select.al-pass");
  var graphs = root.querySelectorAll(".al-graph");
  var playButton = root.querySelector("button[data-go=play]");
  var pass = 0, step = 0, timer = null;
  var predict = !!data.predict, answered = {};  // "pass:step" -> [right, message] once a question is settled

  function keys(object) { return Object.keys(object).sort(); }

  function frameCss(steps, k, asking) {
    // asking: step k's gradient is being predicted, so its arrows and .grad are not shown yet
    var edges = {}, grads = {}, done = {}, i, last = asking ? k - 1 : k;
    for (i = 0; i <= last; i++) {
      steps[i].edges.forEach(function (e) { edges[e] = 1; });
      steps[i].grads.forEach(function (g) { grads[g] = 1; });
    }
    for (i = 0; i < k; i++) { steps[i].done.forEach(function (d) { done[d] = 1; }); }
    var current = steps[k].node;
    if (current) { delete done[current]; }
    var rules = [], list;
    list = keys(edges);
    if (list.length) {
      rules.push(list.map(function (e) { return scope + " #" + e + " text"; }).join(", ") + " {visibility: visible}");
      rules.push(list.map(function (e) { return scope + " #" + e + " path"; }).join(", ") +
        " {stroke: " + DONE + "; stroke-width: 2px}");
    }
    list = keys(grads);
    if (list.length) {
      rules.push(list.map(function (n) { return scope + " #" + n + " .al-after"; }).join(", ") + " {display: inline}");
      rules.push(list.map(function (n) { return scope + " #" + n + " .al-before"; }).join(", ") + " {display: none}");
    }
    list = keys(done);
    if (list.length) {
      var shapes = [];
      list.forEach(function (n) {
        ["polygon", "path", "ellipse"].forEach(function (s) { shapes.push(scope + " #" + n + " > " + s); });
      });
      rules.push(shapes.join(", ") + " {stroke: " + DONE + "; stroke-width: 2.5px}");
    }
    if (current) {
      rules.push(["polygon", "path", "ellipse"].map(function (s) { return scope + " #" + current + " > " + s; })
        .join(", ") + " {stroke: " + CURRENT + "; stroke-width: 5px; stroke-dasharray: 8 3}");
    }
    return rules.join("\n");
  }

  function question(k) { var q = data.passes[pass].questions; return predict && q ? q[k] : null; }

  function escapeText(text) { var div = document.createElement("div"); div.textContent = text; return div.innerHTML; }

  function show(k) {
    var steps = data.passes[pass].steps;
    step = Math.max(0, Math.min(k, steps.length - 1));
    var ask = question(step), settled = answered[pass + ":" + step];
    frameStyle.textContent = frameCss(steps, step, !!(ask && !settled));
    if (ask && !settled) {
      cardBox.innerHTML = ask[0];
      var box = cardBox.querySelector("input.al-answer");
      if (box && root.contains(document.activeElement)) { box.focus(); }
    } else {
      cardBox.innerHTML = (settled ? '<div class="al-feedback ' + (settled[0] ? "al-right" : "al-wrong") + '">' +
        escapeText(settled[1]) + "</div>" : "") + data.passes[pass].cards[step];
    }
    // in predict mode the with/without table would give the answers away: it shows at the last step
    tableBox.style.display = predict && step < steps.length - 1 ? "none" : "";
    slider.max = steps.length - 1;
    slider.value = step;
    position.textContent = "step " + step + " of " + (steps.length - 1);
    root.setAttribute("data-step", String(step));
  }

  function choosePass(p) {
    pass = p;
    for (var i = 0; i < graphs.length; i++) { graphs[i].style.display = i === p ? "" : "none"; }
    tableBox.innerHTML = data.passes[p].table;
    stop();
    show(0);
  }

  // Mirrors autograd_lens.views.steps.check_answer: same parsing, tolerance and words.
  function check(text, answer, shown) {
    var numbers = (text.match(/[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?/g) || []).map(parseFloat);
    if (!numbers.length) { return [false, "Type a number (or a list such as [1, 2]); autograd computed " + shown + "."]; }
    if (numbers.length === 1 && answer.length > 1) {
      numbers = answer.map(function () { return numbers[0]; });
    }
    if (numbers.length !== answer.length) {
      return [false, "Not quite: that is " + numbers.length + " number" + (numbers.length !== 1 ? "s" : "") +
        ", the gradient has " + answer.length + ". Autograd computed " + shown + "."];
    }
    var close = numbers.every(function (a, i) { return Math.abs(a - answer[i]) <= 1e-3 + 1e-3 * Math.abs(answer[i]); });
    return close ? [true, "Right: autograd computed " + shown + "."] : [false, "Not quite: autograd computed " + shown + "."];
  }

  function settle(reveal) {
    var ask = question(step);
    if (!ask) { return; }
    if (reveal) {
      answered[pass + ":" + step] = [false, "Autograd computed " + ask[2] + "."];
    } else {
      var box = cardBox.querySelector("input.al-answer");
      answered[pass + ":" + step] = check(box ? box.value : "", ask[1], ask[2]);
    }
    show(step);
  }

  cardBox.addEventListener("click", function (event) {
    var go = event.target.getAttribute && event.target.getAttribute("data-go");
    if (go === "check" || go === "reveal") { settle(go === "reveal"); }
  });
  cardBox.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && event.target.classList && event.target.classList.contains("al-answer")) {
      event.preventDefault();
      settle(false);
    }
  });

  function stop() {
    if (timer) { clearInterval(timer); timer = null; }
    playButton.textContent = "play";
    playButton.setAttribute("aria-pressed", "false");
  }

  function play() {
    if (timer) { stop(); return; }
    if (step >= data.passes[pass].steps.length - 1) { show(0); }
    playButton.textContent = "pause";
    playButton.setAttribute("aria-pressed", "true");
    timer = setInterval(function () {
      if (step >= data.passes[pass].steps.length - 1) { stop(); return; }
      show(step + 1);
      if (question(step) && !answered[pass + ":" + step]) { stop(); }  // wait for the student's answer
    }, 900);
  }

  root.querySelector(".al-controls").addEventListener("click", function (event) {
    var go = event.target.getAttribute && event.target.getAttribute("data-go");
    if (!go) { return; }
    if (go === "play") { play(); return; }
    stop();
    if (go === "first") { show(0); }
    if (go === "prev") { show(step - 1); }
    if (go === "next") { show(step + 1); }
    if (go === "last") { show(data.passes[pass].steps.length - 1); }
  });
  slider.addEventListener("input", function () { stop(); show(parseInt(slider.value, 10)); });
  if (passSelect) { passSelect.addEventListener("change", function () { choosePass(parseInt(passSelect.value, 10)); }); }
  root.addEventListener("keydown", function (event) {
    var tag = event.target && event.target.tagName;
    if (tag === "INPUT") { return; }  // typing an answer, or the slider (which steps by itself)
    if (event.key === "ArrowRight") { stop(); show(step + 1); }
    if (event.key === "ArrowLeft") { stop(); show(step - 1); }
  });
  root.frameCss = function (p, k) { return frameCss(data.passes[p].steps, k); };
  root.answer = function (text) { var box = cardBox.querySelector("input.al-answer"); if (box) { box.value = text; } settle(false); };
  choosePass(0);
})(document.currentScript && document.currentScript.parentNode);
