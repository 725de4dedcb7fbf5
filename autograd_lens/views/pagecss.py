"""The style sheet of the stepper and of the graph's navigator (one module both use, so that drawing a graph
loads nothing of the stepper's steps and cards)."""

BASE_CSS = """\
{scope} {{color: var(--jp-ui-font-color1, inherit); font-family: var(--jp-ui-font-family, Helvetica, Arial, sans-serif);
  font-size: 13px}}
{scope}:focus-visible, {scope} button:focus-visible, {scope} input:focus-visible, {scope} select:focus-visible {{
  outline: 2px solid #2563eb; outline-offset: 2px}}
{scope} .edge text {{visibility: hidden}}
{scope} .al-after {{display: none; visibility: visible}}
{scope} .al-before {{visibility: visible}}
{scope} .al-viewport {{position: relative; overflow: hidden; cursor: grab; touch-action: none; min-height: 160px;
  border: 1px solid var(--jp-border-color2, #e5e7eb); border-radius: 6px; margin: 4px 0;
  background: #ffffff}}
{scope} .al-viewport.al-dragging {{cursor: grabbing}}
{scope} .al-canvas {{position: absolute; left: 0; top: 0; transform-origin: 0 0}}
{scope} .al-canvas svg {{display: block; background: #ffffff; border-radius: 4px; max-width: none; max-height: none}}
{scope}.al-overview .node:not(.al-foldable) text, {scope}.al-overview .edge text, {scope}.al-overview .cluster > text.al-small {{
  display: none !important}}
{scope} .cluster {{cursor: pointer}}
{scope} .cluster > text.al-group-name {{display: none; fill: #4c1d95; font-weight: bold}}
{scope} .cluster.al-collapsed > text.al-group-name {{display: inline}}
{scope} .cluster.al-collapsed > text.al-group-name.al-tiny {{display: none}}
{scope} .cluster.al-collapsed > text.al-small {{display: none}}
{scope} .cluster.al-collapsed > path, {scope} .cluster.al-collapsed > polygon {{fill: #ede9fe; stroke-dasharray: none}}
{scope} .al-card {{border: 1px solid var(--jp-border-color2, #d1d5db); border-radius: 6px; padding: 8px 12px;
  margin: 6px 0; line-height: 1.45; background: var(--jp-layout-color1, #f9fafb); color: var(--jp-ui-font-color1, #111827)}}
{scope} .al-title {{font-weight: bold; margin-bottom: 2px}}
{scope} .al-step {{color: var(--jp-ui-font-color2, #6b7280); font-size: 11px}}
{scope} .al-hook {{border-left: 5px solid #d97706}}
{scope} .al-error {{border-left: 5px solid #dc2626}}
{scope} .al-note {{margin-top: 4px; color: var(--jp-warn-color0, #92400e)}}
{scope} .al-changes td {{padding: 1px 6px; border: 1px solid var(--jp-border-color2, #e5e7eb); font-family: monospace;
  white-space: nowrap; text-align: left}}
{scope} table.al-changes, {scope} table.al-changes > tbody, {scope} table.al-changes tr {{display: flex; flex-wrap: wrap;
  gap: 3px}}
{scope} .al-changed {{background: #fde68a; color: #111827; font-weight: bold}}
{scope} table.al-grads {{border-collapse: collapse; font-size: 13px}}
{scope} table.al-grads td, {scope} table.al-grads th {{border: 1px solid var(--jp-border-color2, #e5e7eb);
  padding: 2px 8px; text-align: left}}
{scope} tr.al-differs {{background: #fef3c7; color: #111827; font-weight: bold}}
{scope} .al-question {{border-left: 5px solid #2563eb}}
{scope} .al-feedback {{font-size: 13px; padding: 4px 12px; border-radius: 6px}}
{scope} .al-right {{background: #dcfce7; color: #14532d}}
{scope} .al-wrong {{background: #fee2e2; color: #7f1d1d}}
{scope} .al-why {{font-size: 13px; padding: 2px 12px}}
{scope} .al-controls {{display: flex; flex-wrap: wrap; align-items: center; gap: 4px}}
{scope} .al-controls button {{font-family: monospace; min-width: 2.6em; padding: 2px 6px; cursor: pointer;
  color: var(--jp-ui-font-color1, #111827); background: var(--jp-layout-color2, #f3f4f6);
  border: 1px solid var(--jp-border-color1, #9ca3af); border-radius: 4px}}
{scope} .al-controls select, {scope} .al-answer {{color: var(--jp-ui-font-color1, #111827);
  background: var(--jp-layout-color1, #ffffff); border: 1px solid var(--jp-border-color1, #9ca3af)}}
{scope} .al-controls select {{max-width: 100%; min-width: 0; text-overflow: ellipsis}}
{scope} .al-zoom {{margin-left: auto; display: inline-flex; align-items: center; gap: 4px}}
{scope} .al-picture {{max-width: 100%; height: auto; background: #ffffff}}
"""


def base_css(scope: str) -> str:
    return BASE_CSS.format(scope=scope)
