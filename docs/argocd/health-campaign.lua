-- Argo CD health of a BenchCampaign (accelbench.io), from its kstatus conditions: Healthy when
-- Ready (every cell finished), Degraded when Stalled (the budget is spent, a cell is invalid),
-- Progressing while cells run or wait. Install: argocd-cm
-- `resource.customizations.health.accelbench.io_BenchCampaign` set to this file.
local hs = {status = "Progressing", message = "waiting for the operator"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.message = "the operator has not seen generation " .. tostring(obj.metadata.generation) .. " yet"
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    return {status = "Degraded", message = c.message or c.reason or ""}
  end
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" and c.status == "True" then
    return {status = "Healthy", message = c.message or ""}
  end
  if c.type == "Reconciling" and c.status == "True" then
    hs.message = c.message or c.reason or ""
  end
end
return hs
