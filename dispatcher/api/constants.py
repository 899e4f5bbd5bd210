"""Names the dispatcher writes onto objects: API group, labels, finalizer. Pure."""

GROUP = "workload.codeflare.dev"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AppWrapper"
PLURAL = "appwrappers"

# Every wrapped object, and every pod template inside it, carries these labels, so the
# dispatcher finds its pods (of any kind, a RayCluster's included) and can adopt or
# collect its objects after a restart.
LABEL_NAME = f"{GROUP}/appwrapper"
LABEL_NAMESPACE = f"{GROUP}/appwrapper-namespace"
LABEL_UID = f"{GROUP}/appwrapper-uid"

# MCAD's labels, also on every wrapped object and pod template: tools and scripts written for
# MCAD find an AppWrapper's objects and pods by them (`-l appwrapper.mcad.ibm.com=NAME`). Only
# informative: ownership is decided by the uid label and the field manager, never by these.
MCAD_LABEL_APPWRAPPER = "appwrapper.mcad.ibm.com"
MCAD_LABEL_RESOURCE = "resourceName"

# Sent as fieldManager on every create of a wrapped object, so the object's managedFields
# record that the dispatcher made it: an object that merely copies the uid label (planted by
# someone else) is not adopted.
FIELD_MANAGER = "appwrapper-dispatcher"

FINALIZER = f"{GROUP}/finalizer"
ANNOTATION_ITEM = f"{GROUP}/item-index"

# Quotas: an AppWrapper names the namespaced queue (AppQueue) it is submitted to with this
# label; Kueue's label, as the Kueue guides write it, is honoured too. A namespace's AppQueue
# named DEFAULT_QUEUE takes AppWrappers that name none.
LABEL_QUEUE = f"{GROUP}/queue-name"
KUEUE_LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
DEFAULT_QUEUE = "default"
