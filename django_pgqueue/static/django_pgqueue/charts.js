/* django-pgqueue admin: draws the Charts page's charts with the vendored uPlot.
   The page gives each chart's description (django_pgqueue/observability/charts.py) in
   the JSON of #pgqueue-charts; the y axis's top and ticks come with it. Times are read
   in the admin's time zone (#pgqueue-charts' "zone"). */
(function () {
    "use strict";
    const page = JSON.parse(document.getElementById("pgqueue-charts").textContent);
    const style = getComputedStyle(document.body);
    const ink = style.getPropertyValue("--body-quiet-color").trim() || "#666";
    const hairline = style.getPropertyValue("--hairline-color").trim() || "#e8e8e8";
    const zoned = (seconds) => uPlot.tzDate(new Date(seconds * 1000), page.zone);
    const clock = uPlot.fmtDate("{HH}:{mm}");
    const stamp = uPlot.fmtDate("{YYYY}-{MM}-{DD} {HH}:{mm}");

    function seconds(value) {
        if (value == null) return "—";
        if (value === 0) return "0";
        if (value < 1) return Math.round(value * 1000) + " ms";
        if (value < 120) return +value.toFixed(1) + " s";
        if (value < 7200) return +(value / 60).toFixed(1) + " min";
        return +(value / 3600).toFixed(1) + " h";
    }
    const count = (value) => (value == null ? "—" : Math.round(value).toLocaleString("en"));

    // A point with no neighbour in its line (a gap on both sides) is marked whatever
    // the line's length: otherwise it would not show at all.
    function lonePoints(u, index) {
        const values = u.data[index];
        const lone = [];
        for (let i = 0; i < values.length; i++) {
            if (values[i] != null && values[i - 1] == null && values[i + 1] == null) lone.push(i);
        }
        return lone;
    }

    function draw(box, chart) {
        const format = chart.unit === "seconds" ? seconds : count;
        const options = {
            title: chart.title,
            width: box.clientWidth,
            height: 230,
            tzDate: zoned,
            legend: {live: true},
            cursor: {drag: {x: true, y: false}, points: {size: 7}},
            scales: {x: {time: true}, y: {range: [0, chart.top]}},
            axes: [
                {stroke: ink, grid: {stroke: hairline, width: 1}, ticks: {stroke: hairline},
                 values: (u, splits) => splits.map((at) => clock(zoned(at)))},
                {stroke: ink, grid: {stroke: hairline, width: 1}, ticks: {stroke: hairline},
                 size: 68,
                 splits: () => chart.ticks.map((tick) => tick[0]),
                 values: () => chart.ticks.map((tick) => tick[1])},
            ],
            series: [
                {label: "time", value: (u, at) => (at == null ? "—" : stamp(zoned(at)) + " " + page.zone_label)},
                ...chart.series.map((line) => ({
                    label: line.label,
                    stroke: line.color,
                    width: 1.6,
                    value: (u, value) => format(value),
                    points: chart.marked
                        ? {show: true, size: 5, fill: line.color}
                        : {show: true, size: 7, fill: line.color, filter: lonePoints},
                })),
            ],
        };
        const data = [chart.times, ...chart.series.map((line) => line.values)];
        const plot = new uPlot(options, data, box);
        new ResizeObserver(() => {
            if (box.clientWidth && box.clientWidth !== plot.width) {
                plot.setSize({width: box.clientWidth, height: 230});
            }
        }).observe(box);
        return plot;
    }

    // The drawn charts, in the page's order (the browser tests read them).
    window.pgqueueCharts = [];
    for (const box of document.querySelectorAll("[data-pgqueue-chart]")) {
        const plot = draw(box, page.charts[Number(box.dataset.pgqueueChart)]);
        box.pgqueueChart = plot;
        window.pgqueueCharts.push(plot);
    }
})();
