"""The VM requests: ``build``, ``start``, ``stop``, ``reboot``, ``suspend``,
``resume``, ``destroy``, ``disown``, ``set_ha``, ``ha_start`` and ``vm_info``, each the function of the
same name in :mod:`engine.hypervisor.vm` (arguments and promises there)."""
from engine.core.handlers import handler
from engine.hypervisor import vm

for _name in ("build", "start", "stop", "reboot", "suspend", "resume", "destroy", "disown",
              "set_ha", "ha_start", "vm_info"):
    handler(_name)(getattr(vm, _name))
