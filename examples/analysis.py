"""Conversion rate per day and a revenue chart, from the sales CSV given with --input."""

import json
import os

import matplotlib.pyplot as plt
import pandas as pd

sales = pd.read_csv("sales.csv", parse_dates=["date"])
daily = sales.groupby("date")[["leads", "paid_conversions", "revenue"]].sum()
daily["conversion_rate"] = daily["paid_conversions"] / daily["leads"]

print(daily.round(4).to_string())
overall = daily["paid_conversions"].sum() / daily["leads"].sum()
print(f"\naverage daily conversion rate: {daily['conversion_rate'].mean():.2%}")
print(f"overall conversion rate:       {overall:.2%}")

os.makedirs("out", exist_ok=True)
fig, ax = plt.subplots(figsize=(7, 4))
ax.bar([d.strftime("%a %d") for d in daily.index], daily["revenue"])
ax.set_title("Revenue per day")
ax.set_ylabel("revenue")
fig.tight_layout()
fig.savefig("out/revenue.png", dpi=100)
with open("out/summary.json", "w") as f:
    json.dump({"overall_conversion_rate": round(overall, 4), "days": len(daily)}, f)
