"""The web console at ``/console``: one more door over the same services.

- pages.py: the pages, shells with no data (they load unsigned under ``auth:``);
- fragments.py: the data as HTML, rendered on the server, escaped in one place;
- state.py: the reads, from the store and from the gateway's memory, of endpoints, jobs
  and events; resources.py: of models, configs, components, alarms and scaling policies;
- listings.py: the fragments of the latter, escaped by fragments.py's one rule;
- door.py: the routes, ``/console/...`` and ``/console/api/...``;
- static/: console.js, an ES module importing signing.js (SigV4, the API's calls),
  polling.js (views, log tail), charts.js, actions.js (the controls, each a call of the
  public API) and tryit.js; and console.css.

No build step: the script and stylesheet are written by hand and served as they are.
"""

from shipyard.gateway.console.door import ConsoleDoor
from shipyard.gateway.console.resources import ResourceReads
from shipyard.gateway.console.state import ConsoleState, JobReads

__all__ = ["ConsoleDoor", "ConsoleState", "JobReads", "ResourceReads"]
